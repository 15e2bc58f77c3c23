"""CPU benchmark of the speech engine per precision: TTFC, RTF and frames/s, per stage, beside the official qwen-tts.

Method: random-weight checkpoints in the official layout (written once under --cache), each --precisions
engine (float32 is the reference path, as the official package computes; bf16 and int8 the fast paths of
engine/tts/cpu.py) at each --threads count. One warm-up utterance per engine and thread count, then --runs
rounds in which every (precision, threads) pair speaks one utterance of --frames frames in turn, so a busy
neighbour on a shared machine slows all of them alike (random weights rarely emit EOS, so each run is cut at
exactly --frames). TTFC is text handed to the engine -> first PCM chunk in host memory; RTF is wall time /
audio time over the whole run. Stage times are medians of direct calls on the same model (the codec's on
1-frame chunks, the first chunk's size). The baseline is the official qwen-tts generate() + decode (float32,
its only CPU path) on the same folder, same run, same frames, at each thread count (greedy both, so the work
is equal).

    python bench/tts_cpu.py --sizes tiny 0.6b --threads 1 2
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
from engine.tts.cpu import choose_precision  # noqa: E402
from engine.tts.sampling import Sampler  # noqa: E402
from engine.tts.testing import write_checkpoint  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then it rests for a while."


def pct(values, q):
    return float(np.percentile(np.asarray(values), q))


def warm_up(tts) -> None:
    list(zip(range(3), tts.stream(TEXT, tts.speakers[0], sampling=SamplingOptions.greedy())))


def bench_run(tts, frames: int, seed: int) -> tuple[float, float, float]:
    """TTFC (ms), RTF and frames/s of one stream of `frames` frames."""
    stream = tts.stream(TEXT, tts.speakers[0], seed=seed, sampling=SamplingOptions.greedy())
    n = 0
    for chunk in stream:
        if n == 0:
            ttfc = 1000 * (chunk.t_ready - stream.t_start)
        n += chunk.codes.shape[0]
        if n >= frames:
            break
    elapsed = time.perf_counter() - stream.t_start
    stream.close()
    return ttfc, elapsed / (n * tts.codec.config.frame_samples / tts.sample_rate_hz), n / elapsed


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
        state = tts.model.begin(inputs.prefill.to(tts.dtype), frames + 1)
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
        tts.model.advance(state, codes, inputs.text_input(state.frame).to(tts.dtype))
        times["talker step"].append(time.perf_counter() - t)
    return {k: 1000 * statistics.median(v) for k, v in times.items() if v}


def bench_official(folder: Path, frames: int, threads: list[int]) -> dict[int, float | None]:
    """threads -> ms per frame of the official generate() + decode, greedy, on the same folder (None if not
    installed)."""
    try:
        from tests.oracle import import_qwen_tts

        qwen_tts = import_qwen_tts()
    except ImportError:
        return dict.fromkeys(threads)
    model = qwen_tts.Qwen3TTSModel.from_pretrained(str(folder), dtype=torch.float32)
    speaker = model.get_supported_speakers()[0]
    kwargs = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=frames + 1, non_streaming_mode=True)
    times = {}
    for count in threads:
        torch.set_num_threads(count)
        model.generate_custom_voice(TEXT, speaker, **{**kwargs, "max_new_tokens": 4})  # warm-up
        t = time.perf_counter()
        model.generate_custom_voice(TEXT, speaker, **kwargs)
        times[count] = 1000 * (time.perf_counter() - t) / frames
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=["tiny", "0.6b"])
    parser.add_argument("--precisions", nargs="+", default=["float32", "bf16", "int8"])
    parser.add_argument("--threads", nargs="+", type=int, default=[torch.get_num_threads()])
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
        engines = {precision: load_tts(folder, precision=precision) for precision in args.precisions}
        pairs = [(precision, threads) for precision in args.precisions for threads in args.threads]
        results = {pair: ([], [], []) for pair in pairs}
        for precision, threads in pairs:
            torch.set_num_threads(threads)
            warm_up(engines[precision])
        for run in range(args.runs):
            for pair in pairs:
                torch.set_num_threads(pair[1])
                for values, value in zip(results[pair], bench_run(engines[pair[0]], args.frames, run)):
                    values.append(value)
        official = bench_official(folder, args.frames, args.threads)
        for precision, threads in pairs:
            torch.set_num_threads(threads)
            stages = bench_stages(engines[precision], min(args.frames, 8))
            ttfc, rtf, fps = results[precision, threads]
            rows.append((size, precision, threads, ttfc, rtf, fps, stages, official[threads]))
        del engines
    print(f"\nCPU: {torch.__version__}, {args.frames} frames x {args.runs} runs, greedy; "
          f"precisions: {', '.join(f'{p} = {choose_precision(p)}' for p in args.precisions)}\n")
    print("| size | precision | threads | TTFC p50 / p95 ms | RTF p50 / p95 | frames/s p50 | prefill ms | "
          "talker step ms | predictor frame ms | codec frame ms | official ms/frame | speed-up vs official |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size, precision, threads, ttfc, rtf, fps, st, official in rows:
        ours_frame = 1000 / statistics.median(fps)
        base = f"{official:.1f} | {official / ours_frame:.2f}x" if official else "n/a | n/a"
        print(f"| {size} | {precision} | {threads} | {pct(ttfc, 50):.0f} / {pct(ttfc, 95):.0f} | "
              f"{pct(rtf, 50):.3f} / {pct(rtf, 95):.3f} | {pct(fps, 50):.1f} | {st['prefill']:.1f} | "
              f"{st['talker step']:.1f} | {st['predictor frame']:.1f} | {st['codec frame']:.1f} | {base} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
