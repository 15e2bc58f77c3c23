"""The random-weight checkpoint the GPU benches run on: the published shapes at --size, written once under
--cache in the official layout (engine.tts.testing.write_checkpoint), so the work per frame is the real one."""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.tts.testing import write_checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="0.6b", help="random checkpoint size")
    parser.add_argument("--cache", default=".cache/bench", help="folder the checkpoint is written to once")


def checkpoint(args: argparse.Namespace) -> Path:
    """The checkpoint folder for args.size under args.cache, written now if it is not there yet."""
    folder = Path(args.cache) / args.size
    if not (folder / "config.json").exists():
        write_checkpoint(folder, args.size, seed=0)
    return folder
