"""CPU benchmark of the PyTorch speech engine: TTFC, RTF and frames/s, per stage, beside the official qwen-tts.

Method: random-weight checkpoints in the official layout (written once under --cache), float32 on this
CPU with torch's default threads. One warm-up utterance, then --runs utterances of --frames frames
(random weights rarely emit EOS, so each run is cut at exactly --frames). TTFC is text handed to the
engine -> first PCM chunk in host memory; RTF is wall time / audio time over the whole run. Stage
times are medians of direct calls on the same model. The baseline is the official qwen-tts
generate() + decode on the same folder, same run, same frames (greedy both, so the work is equal).

    python bench/tts_cpu.py --sizes tiny 0.6b
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import SamplingOptions, load_tts  # noqa: E402
from engine.tts.sampling import Sampler  # noqa: E402
from engine.tts.testing import write_checkpoint  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then it rests for a while."


def pct(values, q):
    return float(np.percentile(np.asarray(values), q))


def bench_engine(tts, frames: int, runs: int):
    """TTFC (ms), RTF and frames/s of whole streams, p50 and p95 over runs."""
    greedy = SamplingOptions.greedy()
    list(zip(range(3), tts.stream(TEXT, tts.speakers[0], sampling=greedy)))  # warm-up
    ttfc, rtf, fps = [], [], []
    for run in range(runs):
        stream = tts.stream(TEXT, tts.speakers[0], seed=run, sampling=greedy)
        n = 0
        for chunk in stream:
            if n == 0:
                ttfc.append(1000 * (chunk.t_ready - stream.t_start))
            n += chunk.codes.shape[0]
            if n >= frames:
                break
        elapsed = time.perf_counter() - stream.t_start
        stream.close()
        rtf.append(elapsed / (n * tts.codec.config.frame_samples / tts.sample_rate_hz))
        fps.append(n / elapsed)
    return ttfc, rtf, fps


def bench_stages(tts, frames: int):
    """Median ms of: prefill, talker step, code-predictor frame, codec decode of one frame."""
    prompts, talker = tts.prompts, tts.config.talker
    voice = tts.resolve_voice(tts.default_speaker)
    inputs = prompts.build(prompts.text_ids(TEXT), voice, True, tts.device)
    sampler = Sampler(SamplingOptions.greedy(), 0, talker.decoder.vocab_size, talker.codec_eos_id, tts._suppress)
    times = {"prefill": [], "talker step": [], "predictor frame": [], "codec frame": []}
    codec = tts.codec.stream()
    for _ in range(3):
        t = time.perf_counter()
        state = tts.model.begin(inputs.prefill, frames + 1)
        times["prefill"].append(time.perf_counter() - t)
    for _ in range(frames):
        t = time.perf_counter()
        codes = tts.model.sample_frame(state, sampler)
        times["predictor frame"].append(time.perf_counter() - t)
        if codes is None:
            break
        t = time.perf_counter()
        codec.decode(codes[None])
        times["codec frame"].append(time.perf_counter() - t)
        t = time.perf_counter()
        tts.model.advance(state, codes, inputs.text_input(state.frame))
        times["talker step"].append(time.perf_counter() - t)
    return {k: 1000 * statistics.median(v) for k, v in times.items() if v}


def bench_official(folder: Path, frames: int):
    """ms per frame of the official generate() + decode, greedy, on the same folder (None if not installed)."""
    try:
        from tests.oracle import import_qwen_tts

        qwen_tts = import_qwen_tts()
    except ImportError:
        return None
    model = qwen_tts.Qwen3TTSModel.from_pretrained(str(folder), dtype=torch.float32)
    speaker = model.get_supported_speakers()[0]
    kwargs = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=frames + 1, non_streaming_mode=True)
    model.generate_custom_voice(TEXT, speaker, **{**kwargs, "max_new_tokens": 4})  # warm-up
    t = time.perf_counter()
    model.generate_custom_voice(TEXT, speaker, **kwargs)
    return 1000 * (time.perf_counter() - t) / frames


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=["tiny", "0.6b"])
    parser.add_argument("--frames", type=int, default=25, help="frames per run (25 = 2 s of speech)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", default=".cache/bench", help="where the random checkpoints are kept")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for size in args.sizes:
        folder = Path(args.cache) / size
        if not (folder / "config.json").exists():
            write_checkpoint(folder, size, seed=0)
        tts = load_tts(folder)
        ttfc, rtf, fps = bench_engine(tts, args.frames, args.runs)
        stages = bench_stages(tts, min(args.frames, 10))
        ours_frame = 1000 / statistics.median(fps)
        official = bench_official(folder, args.frames)
        rows.append((size, ttfc, rtf, fps, stages, ours_frame, official))
        del tts
    print(f"\nCPU: {torch.get_num_threads()} threads, torch {torch.__version__}, float32, "
          f"{args.frames} frames x {args.runs} runs, greedy\n")
    print("| size | TTFC p50 / p95 ms | RTF p50 / p95 | frames/s p50 | prefill ms | talker step ms | "
          "predictor frame ms | codec frame ms | official ms/frame | speed-up vs official |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size, ttfc, rtf, fps, st, ours_frame, official in rows:
        base = f"{official:.1f} | {official / ours_frame:.2f}x" if official else "n/a | n/a"
        print(f"| {size} | {pct(ttfc, 50):.0f} / {pct(ttfc, 95):.0f} | {pct(rtf, 50):.3f} / {pct(rtf, 95):.3f} | "
              f"{pct(fps, 50):.1f} | {st['prefill']:.1f} | {st['talker step']:.1f} | {st['predictor frame']:.1f} | "
              f"{st['codec frame']:.1f} | {base} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
