"""Seed sweep of the talker's codebook-0 draws: how many pick a code the codec has no entry for (a suppressed id, or
EOS before the two-frame minimum), over whole utterances rather than one frame.

Method, --mode replay (the CPU's default): the tiny random-weight checkpoint's talker logits are recorded at every
frame of --utterances real streams of --text (each to EOS or its runaway cap); then each of --seeds seeds draws a
whole utterance through the real Sampler over one of those recordings, frame 0 to EOS or the cap. A draw's noise
depends on (seed, frame, token) alone, so this reaches every frame index a stream of that text reaches.
--mode streams (the GPU's default): --seeds whole streams through the engine itself (on a GPU, the megakernel's
on-device sampling), counting the frames its guard refused ("outside the codec's" in the log) and any code out of
range that got through.

    python bench/sampling_sweep.py --seeds 10000
    python bench/sampling_sweep.py --seeds 10000 --device cuda
    python bench/sampling_sweep.py --seeds 2500 --first-seed 2500 --device cuda   # a quarter, beside the others
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import load_tts  # noqa: E402
from engine.tts import stream as stream_module  # noqa: E402
from engine.tts.sampling import Sampler  # noqa: E402
from engine.tts.testing import write_checkpoint  # noqa: E402


def record_logits(tts, text: str, utterances: int) -> list[torch.Tensor]:
    """Codebook-0 logits (frames, vocab) at every frame of `utterances` real streams of `text`."""
    recordings = []

    class Recording(Sampler):
        def talker(self, logits, frame):
            recordings[-1].append(logits.float().cpu().clone())
            return super().talker(logits, frame)

    real = stream_module.Sampler
    stream_module.Sampler = Recording
    try:
        for seed in range(utterances):
            recordings.append([])
            tts.synthesize(text, tts.speakers[0], seed=seed)
    finally:
        stream_module.Sampler = real
    return [torch.stack(r) for r in recordings]


def sweep_sampler(tts, recordings: list[torch.Tensor], seeds: range) -> tuple[int, list[tuple[int, int, int]]]:
    """(draws, invalid picks as (seed, frame, code)) of whole utterances through the Sampler, one a seed."""
    talker = tts.config.talker
    suppress = tts._suppress.cpu()
    draws, invalid = 0, []
    for seed in seeds:
        sampler = Sampler(tts.default_sampling, seed, talker.decoder.vocab_size, talker.codec_eos_id, suppress)
        for frame, logits in enumerate(recordings[seed % len(recordings)]):
            code = int(sampler.talker(logits, frame))
            draws += 1
            if code == sampler.eos_id and frame >= sampler.min_frames:
                break
            if suppress[code] or code == sampler.eos_id:
                invalid.append((seed, frame, code))
    return draws, invalid


class _Refusals(logging.Handler):
    """Counts the stream guard's warnings: a frame with a code outside the codec's range."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        self.count += "outside the codec's" in record.getMessage()


def sweep_streams(tts, text: str, seeds: range) -> tuple[int, int, int]:
    """(frames, frames the guard refused, codes out of range that got through) of whole streams, one a seed."""
    refusals = _Refusals()
    logging.getLogger("engine.tts.stream").addHandler(refusals)
    codebook = tts.codec.config.codebook_size
    frames = leaked = 0
    try:
        for done, seed in enumerate(seeds, 1):
            for chunk in tts.stream(text, tts.speakers[0], seed=seed):
                frames += chunk.codes.shape[0]
                leaked += int(((chunk.codes < 0) | (chunk.codes >= codebook)).sum())
            if done % 1000 == 0:  # a run cut off part-way still says how far it got
                print(f"... {done:,} seeds: {frames:,} frames, {refusals.count} refused, {leaked} out of range",
                      flush=True)
    finally:
        logging.getLogger("engine.tts.stream").removeHandler(refusals)
    return frames, refusals.count, leaked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10_000)
    parser.add_argument("--first-seed", type=int, default=0, help="the sweep's seeds are first..first + seeds - 1")
    parser.add_argument("--text", default="Hi.", help="each utterance's text (its length sets the runaway cap)")
    parser.add_argument("--utterances", type=int, default=8, help="CPU: real streams whose logits are replayed")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--mode", choices=("replay", "streams"), help="default: replay on the CPU, streams on a GPU")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench-ckpt")
    args = parser.parse_args()

    folder = args.cache / "tiny"
    if not (folder / "config.json").exists():
        write_checkpoint(folder, "tiny", seed=0)
    tts = load_tts(folder, device=args.device)
    t0 = time.perf_counter()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"| figure | value |\n|---|---|\n| device | {tts.device} |\n"
          f"| seeds | {len(seeds):,} ({seeds.start}..{seeds.stop - 1}) |")
    mode = args.mode or ("replay" if tts.device.type == "cpu" else "streams")
    if mode == "replay":
        recordings = record_logits(tts, args.text, args.utterances)
        draws, invalid = sweep_sampler(tts, recordings, seeds)
        print(f"| recorded frames an utterance | {', '.join(str(len(r)) for r in recordings)} |")
        print(f"| codebook-0 draws | {draws:,} |\n| invalid picks | {len(invalid):,} |")
        if invalid:
            print(f"| first (seed, frame, code) | {invalid[:3]} |")
    else:
        frames, refused, leaked = sweep_streams(tts, args.text, seeds)
        print(f"| frames | {frames:,} |\n| frames refused by the guard | {refused:,} |\n| codes out of range heard | "
              f"{leaked:,} |\n| megakernel | {tts.model.frame_kernel is not None} |")
    print(f"| wall time | {time.perf_counter() - t0:.0f} s |")


if __name__ == "__main__":
    main()
