"""Frame time of two versions of the megakernel, alternated in separate processes on one GPU: an A/B whose
baseline runs in the same lease, between the same frames.

The baseline is csrc/megakernel at a git revision (exported to a temporary folder), or a folder holding such a
copy (where the tree has no git history, as on the GPU machine: export it here and carry it), the candidate the
working tree's. Each round times each version once, in its own process (two extensions of one kernel cannot share a
process: their bindings register the same types), with `run_frames` of bench/megakernel_trace.py on the same
random checkpoint: 64 sampled frames, 4 a launch, after 8 of warm-up. Two rounds or more show the spread,
which a difference must beat; `--base HEAD` against an unchanged tree measures that spread alone.

    python bench/megakernel_ab.py --base main --size 0.6b
    mkdir -p .dev/main && git archive main csrc/megakernel | tar -x -C .dev/main   # then there: --base .dev/main/csrc/megakernel
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


def export(revision: str, folder: Path) -> Path:
    """csrc/megakernel as it is at `revision`, written under `folder`."""
    archive = subprocess.run(["git", "archive", revision, "csrc/megakernel"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "csrc" / "megakernel"


def time_frames(source: Path, args: argparse.Namespace) -> list[float]:
    """In this process: the kernel built from `source`, per-frame ms of each launch."""
    from engine.tts import load_tts, megakernel
    from megakernel_trace import run_frames  # bench/

    megakernel.CSRC = source  # the module builds from this folder (its hash names the build)
    tts = load_tts(checkpoint(args), device="cuda", megakernel=True)
    run_frames(tts, 8, args.per_launch)
    return run_frames(tts, args.frames, args.per_launch)


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--base", default="HEAD", help="the baseline: a git revision, or a csrc/megakernel folder")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--per-launch", type=int, default=4)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)  # a child: time this folder and print
    args = parser.parse_args()
    if args.source:
        print(json.dumps(time_frames(args.source, args)))
        return 0

    checkpoint(args)  # written once, before the children race to write it
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.base) if Path(args.base).is_dir() else export(args.base, Path(tmp))
        versions = {f"base ({args.base})": base.resolve(), "working tree": ROOT / "csrc" / "megakernel"}
        p50 = {name: [] for name in versions}
        for _ in range(args.rounds):
            for name, source in versions.items():
                child = subprocess.run([sys.executable, __file__, "--source", str(source), "--size", args.size,
                                        "--cache", str(args.cache), "--frames", str(args.frames),
                                        "--per-launch", str(args.per_launch)],
                                       capture_output=True, text=True)
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
