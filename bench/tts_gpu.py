"""GPU benchmark of the speech engine: PyTorch eager beside the megakernel's decoder steps, one table, one run.

Method: a random-weight checkpoint in the official layout (written once under --cache), bf16 on the
GPU, loaded twice: PyTorch eager, and with the megakernel attached (each one-token decoder step in one
persistent launch; heads, sampling and embeddings still PyTorch ops). Stage times: CUDA events around each call after a warm-up, p50/p95 over --frames frames: the
talker step (16-embedding sum + 28-layer step + codec head), the code-predictor frame (codebook-0
pick + 15 predictor passes with their heads and picks) and the codec's decode of one frame. TTFC is
text handed over -> first PCM chunk in host memory (wall clock, --runs runs); RTF is wall time / audio
time over 20 s of speech. The floor is the frame's weight bytes (talker once, predictor 15 times) over
the device-to-device copy bandwidth measured in the same run.

    python bench/tts_gpu.py --size 0.6b
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import SamplingOptions, load_tts  # noqa: E402
from engine.tts.sampling import Sampler  # noqa: E402
from engine.tts.testing import write_checkpoint  # noqa: E402

TEXT = ("Parley speaks while it thinks: every eighty milliseconds of speech is one frame of sixteen codes, "
        "decoded to sound as soon as it is sampled.")


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written per second (median of 20)."""
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * src.numel() * src.element_size() / np.median(times[5:]) / 1e9


def timed(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return out, start.elapsed_time(end)


def stage_times(tts, frames: int):
    prompts, talker = tts.prompts, tts.config.talker
    voice = tts.resolve_voice(tts.default_speaker)
    inputs = prompts.build(prompts.text_ids(TEXT), voice, True, tts.device)
    sampler = Sampler(SamplingOptions(), 0, talker.decoder.vocab_size, talker.codec_eos_id, tts._suppress)
    state = tts.model.begin(inputs.prefill.to(tts.dtype), frames + 1)
    codec = tts.codec.stream()
    step, predictor, decode = [], [], []
    for i in range(frames):
        codes, ms = timed(lambda: tts.model.sample_frame(state, sampler))
        predictor.append(ms)
        if codes is None:
            break
        decode.append(timed(lambda: codec.decode(codes[None]))[1])
        step.append(timed(lambda: tts.model.advance(state, codes, inputs.text_input(state.frame).to(tts.dtype)))[1])
    return step[5:], predictor[5:], decode[5:]


def stream_times(tts, runs: int, seconds: float):
    frame_s = tts.codec.config.frame_samples / tts.sample_rate_hz
    ttfc, rtf = [], []
    for run in range(runs):
        stream = tts.stream(TEXT, tts.speakers[0], seed=run)
        n = 0
        for chunk in stream:
            if n == 0:
                ttfc.append(1000 * (chunk.t_ready - stream.t_start))
            n += chunk.codes.shape[0]
            if n * frame_s >= seconds:
                break
        rtf.append((time.perf_counter() - stream.t_start) / (n * frame_s))
        stream.close()
    return ttfc, rtf


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="0.6b")
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="speech per RTF run")
    parser.add_argument("--cache", default=".cache/bench")
    args = parser.parse_args()
    folder = Path(args.cache) / args.size
    if not (folder / "config.json").exists():
        write_checkpoint(folder, args.size, seed=0)
    bandwidth = copy_bandwidth_gbs()
    results = {}
    for name, kernel in (("PyTorch eager", False), ("megakernel", True)):
        tts = load_tts(folder, device="cuda", megakernel=kernel)
        list(zip(range(10), tts.stream(TEXT, tts.speakers[0], seed=0)))  # warm-up (and the kernel's build)
        results[name] = (*stage_times(tts, args.frames), *stream_times(tts, args.runs, args.seconds))
    layers = tts.model.talker.model.layers
    talker_bytes = sum(p.numel() * p.element_size() for p in layers.parameters())
    talker_bytes += tts.model.talker.codec_head.weight.numel() * 2
    predictor = tts.model.talker.code_predictor
    predictor_bytes = sum(p.numel() * p.element_size() for p in predictor.model.layers.parameters())
    predictor_bytes = 15 * (predictor_bytes + predictor.lm_head[0].weight.numel() * 2)
    floors = [talker_bytes / bandwidth / 1e6, predictor_bytes / bandwidth / 1e6, None, None, None]
    names = ["talker step (ms)", "code-predictor frame (ms)", "codec frame (ms)", "TTFC (ms)",
             f"RTF over {args.seconds:.0f} s"]
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.size} bf16; "
          f"copy bandwidth {bandwidth:.0f} GB/s (same run)\n")
    print("| figure | eager p50 | eager p95 | megakernel p50 | megakernel p95 | speed-up p50 | floor | megakernel / floor |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (name, floor) in enumerate(zip(names, floors)):
        e, k = results["PyTorch eager"][i], results["megakernel"][i]
        e50, e95, k50, k95 = (np.percentile(v, q) for v in (e, k) for q in (50, 95))
        tail = f"{floor:.3f} | {k50 / floor:.1f}x" if floor else "- | -"
        print(f"| {name} | {e50:.3f} | {e95:.3f} | {k50:.3f} | {k95:.3f} | {e50 / k50:.1f}x | {tail} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
