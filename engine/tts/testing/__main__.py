"""python -m engine.tts.testing make-checkpoint DIR --size tiny|tiny-1.7b|0.6b|1.7b [--type custom_voice|base]
[--seed N] [--shards N]"""

import argparse
import sys

from engine.tts.testing.checkpoint import MODEL_TYPES, SIZES, write_checkpoint


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tts.testing")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make-checkpoint", help="write a random-weight checkpoint in the official layout")
    make.add_argument("folder")
    make.add_argument("--size", choices=SIZES, default="tiny")
    make.add_argument("--type", choices=MODEL_TYPES, default="custom_voice",
                      help="custom_voice (named speakers) or base (voice cloning)")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--shards", type=int, default=1, help="split model.safetensors into this many shards")
    args = parser.parse_args(argv)
    try:
        path = write_checkpoint(args.folder, args.size, args.seed, args.shards, args.type)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
