"""Quality of the CPU's fast precisions against float32 on the same checkpoint, teacher-forced.

Method (engine/tts/testing/quality.py): --frames codes drawn uniformly from the codebooks are fed to both
engines. float32 runs each stack once over the whole sequence; the fast engine steps as it does when it
speaks. Printed: top-1 agreement of codebook 0 and of codebooks 1..15 (the predictor on the fast engine's
own talker state), and the codec's SNR streamed in the engine's chunks against float32's full decode over
the first --codec-frames frames. Random weights have O(1) logit gaps by construction, so rounding flips a
top-1 choice more often than trained weights with a clear favourite would; read these as a lower bound.

    python bench/tts_cpu_quality.py --size 0.6b --frames 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import load_tts  # noqa: E402
from engine.tts.testing import write_checkpoint  # noqa: E402
from engine.tts.testing.quality import measure  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="0.6b")
    parser.add_argument("--precisions", nargs="+", default=["int8", "bf16"])
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--codec-frames", type=int, default=100)
    parser.add_argument("--cache", default=".cache/bench", help="where the random checkpoints are kept")
    args = parser.parse_args()
    folder = Path(args.cache) / args.size
    if not (folder / "config.json").exists():
        write_checkpoint(folder, args.size, seed=0)
    reference = load_tts(folder, precision="float32")
    rows = []
    for precision in args.precisions:
        t = time.perf_counter()
        engine = load_tts(folder, precision=precision)
        result = measure(reference, engine, args.frames, args.codec_frames)
        rows.append((engine.precision, result, time.perf_counter() - t))
        print(f"{precision}: {result} ({rows[-1][2]:.0f} s)", file=sys.stderr, flush=True)
        del engine
    print(f"\n{args.size}, {args.frames} teacher-forced frames, codec over {args.codec_frames}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}\n")
    print("| precision | codebook 0 top-1 agreement | codebooks 1..15 top-1 agreement | codec SNR dB |")
    print("|---|---|---|---|")
    for precision, result, _ in rows:
        print(f"| {precision} | {result.talker:.4f} | {result.predictor:.4f} | {result.codec_snr_db:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
