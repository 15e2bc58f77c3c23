"""Frame time of two versions of the megakernel, alternated in separate processes on one GPU: an A/B whose
baseline runs in the same lease, between the same frames.

A version is a whole tree's engine/, csrc/ and bench/: the kernel, its binding and engine/tts/kernels/ change
together. The baseline is those folders at a git revision (exported to a temporary folder), or a folder holding
such an export (where the tree has no git history, as on the GPU machine: export it here and carry it), the
candidate the working tree. Each round times each version once, in its own process run from its own tree (two
extensions of one kernel cannot share a process: their bindings register the same types), with `run_frames` of
its bench/megakernel_trace.py on the same random checkpoint: 64 sampled frames, 4 a launch, after 8 of warm-up.
Two rounds or more show the spread, which a difference must beat; `--base HEAD` against an unchanged tree
measures that spread alone.

    python bench/megakernel_ab.py --base main --size 0.6b
    mkdir -p .dev/main && git archive main engine csrc bench | tar -x -C .dev/main   # then there: --base .dev/main
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_checkpoint import add_arguments as add_checkpoint_arguments, checkpoint  # noqa: E402  (bench/)

FOLDERS = ("engine", "csrc", "bench")

# A child, run from a version's tree with the arguments as JSON: its own engine, kernel and run_frames.
CHILD = """
import argparse, json, sys
sys.path[:0] = [".", "bench"]
from engine.tts import load_tts
from megakernel_trace import run_frames
from bench_checkpoint import checkpoint
args = argparse.Namespace(**json.loads(sys.argv[1]))
tts = load_tts(checkpoint(args), device="cuda", megakernel=True)
run_frames(tts, 8, args.per_launch)
print(json.dumps(run_frames(tts, args.frames, args.per_launch)))
"""


def export(revision: str, folder: Path) -> Path:
    """The version's folders as they are at `revision`, written under `folder`."""
    archive = subprocess.run(["git", "archive", revision, *FOLDERS], cwd=ROOT, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--base", default="HEAD", help="the baseline: a git revision, or a folder of its "
                        + ", ".join(FOLDERS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--per-launch", type=int, default=4)
    args = parser.parse_args()
    child_args = json.dumps({"size": args.size, "cache": str(Path(args.cache).resolve()), "frames": args.frames,
                             "per_launch": args.per_launch})

    checkpoint(args)  # written once, before the children race to write it
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.base) if Path(args.base).is_dir() else export(args.base, Path(tmp))
        missing = [name for name in FOLDERS if not (base / name).is_dir()]
        if missing:
            parser.error(f"{base} has no {', '.join(missing)}: --base takes a folder of {', '.join(FOLDERS)}")
        versions = {f"base ({args.base})": base.resolve(), "working tree": ROOT}
        p50 = {name: [] for name in versions}
        for _ in range(args.rounds):
            for name, tree in versions.items():
                child = subprocess.run([sys.executable, "-c", CHILD, child_args], cwd=tree, capture_output=True,
                                       text=True)
                if child.returncode != 0:
                    print(child.stderr, file=sys.stderr)
                    return child.returncode
                p50[name].append(float(np.median(json.loads(child.stdout.splitlines()[-1]))))
    base_ms = np.median(next(iter(p50.values())))
    print(f"\n{args.size}, {args.frames} frames a run, {args.per_launch} a launch, {args.rounds} rounds alternated\n")
    print("| version | frame p50 ms, each round | median | base / this |")
    print("|---|---|---|---|")
    for name, values in p50.items():
        print(f"| {name} | {', '.join(f'{v:.3f}' for v in values)} | {np.median(values):.3f} "
              f"| {base_ms / np.median(values):.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
