"""GPU benchmark of the speech engine: PyTorch eager, PyTorch CUDA graphs and the megakernel, one table, one run.

Method: a random-weight checkpoint in the official layout (written once under --cache), bf16 on the
GPU. Stage times are CUDA events around each call after a warm-up, p50/p95 over --frames frames:
- talker step: the 16-embedding sum + the 28-layer step + the codec head;
- code-predictor frame: codebook-0 pick + the 15 predictor passes with their heads and picks;
- codec frame: the speech tokenizer's decode of one frame (the same PyTorch code in every column).
Eager runs engine/tts/model.py op by op. CUDA graphs replays the same ops captured once: the talker step
at a fixed position (replayed there; a step's cost barely depends on it) and the whole predictor frame
with greedy picks (argmax is capturable). The megakernel runs whole frames in one launch each; its
predictor frame is a launch without the talker step, its talker step a full frame's launch minus that.
TTFC is text handed over -> first PCM chunk in host memory (wall clock, --runs runs), also taken apart
(prompt, prefill, first frame, codec, copy to host; each part synchronized); RTF is wall time /
audio time over --seconds of speech (eager and megakernel; CUDA graphs is not an engine path). The floor
is the frame's weight bytes (talker once, predictor 15 times) over the device-to-device copy bandwidth
measured in the same run.

    python bench/tts_gpu.py --size 0.6b
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import SamplingOptions, load_tts  # noqa: E402
from engine.tts.graphs import GraphSet  # noqa: E402
from engine.tts.sampling import Sampler  # noqa: E402
from gpu_bandwidth import copy_bandwidth_gbs  # noqa: E402  (bench/, the script's folder)
from bench_checkpoint import add_arguments as add_checkpoint_arguments, checkpoint  # noqa: E402  (bench/)

TEXT = ("Parley speaks while it thinks: every eighty milliseconds of speech is one frame of sixteen codes, "
        "decoded to sound as soon as it is sampled.")


def timed(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return out, start.elapsed_time(end)


def _setup(tts, frames: int):
    prompts, talker = tts.prompts, tts.config.talker
    voice = tts.resolve_voice(tts.default_speaker)
    inputs = prompts.build(prompts.text_ids(TEXT), voice, True, tts.device)
    sampler = Sampler(SamplingOptions(), 0, talker.decoder.vocab_size, talker.codec_eos_id, tts._suppress,
                      min_frames=10**9)
    return inputs, sampler, tts.model.begin(inputs.prefill.to(tts.dtype), frames + 1)


def eager_times(tts, frames: int):
    inputs, sampler, state = _setup(tts, frames)
    codec = tts.codec.stream()
    step, predictor, decode = [], [], []
    for _ in range(frames):
        codes, ms = timed(lambda: tts.model.sample_frame(state, sampler))
        predictor.append(ms)
        decode.append(timed(lambda: codec.decode(codes[None]))[1])
        step.append(timed(lambda: tts.model.advance(state, codes, inputs.text_input(state.frame).to(tts.dtype)))[1])
    return step[5:], predictor[5:], decode[5:]


def graph_times(tts, frames: int):
    """The talker step and the predictor frame as CUDA graphs of the eager engine's own ops."""
    inputs, _, state = _setup(tts, frames)
    talker = tts.model.talker
    greedy = Sampler(SamplingOptions.greedy(), 0, tts.config.talker.decoder.vocab_size,
                     tts.config.talker.codec_eos_id, tts._suppress)
    codes = torch.zeros(16, dtype=torch.int64, device="cuda")
    text = inputs.text_input(0).to(tts.dtype)
    position = state.cache.length

    def talker_step():
        state.cache.length = position  # a replay steps at the captured position again
        hidden = talker.model((talker.frame_embedding(codes) + text)[None], state.cache)[0]
        return talker.codec_head(hidden)

    def predictor_frame():
        return talker.code_predictor.predict(state.hidden, talker.codec_embed(codes[0]), greedy, 0)

    replays, graphs = [], GraphSet(tts.device)
    with torch.inference_mode():
        for fn in (talker_step, predictor_frame):
            graph, _ = graphs.capture(fn.__name__, fn)
            replays.append([timed(graph.replay)[1] for _ in range(frames)][5:])
    return replays[0], replays[1]


def kernel_times(tts, frames: int):
    """Frame launches with and without the talker step (codes and the codec as the engine runs them)."""
    inputs, sampler, state = _setup(tts, frames)
    kernel, codec = tts.model.frame_kernel, tts.codec.stream()
    step, predictor, decode = [], [], []
    cancelled = threading.Event()
    frames_iter = kernel.run(state, sampler, inputs, frames + 1, cancelled)
    next(frames_iter)  # the first launch of a run has no talker step: the prefill gave the state
    for _ in range(frames):
        codes, ms = timed(lambda: next(frames_iter))
        step.append(ms)
        decode.append(timed(lambda: codec.decode(codes[None]))[1])
    frames_iter.close()
    for _ in range(frames // 2):  # first launches of fresh runs: the predictor frame alone
        inputs, sampler, state = _setup(tts, 2)
        predictor.append(timed(lambda: next(kernel.run(state, sampler, inputs, 1, cancelled)))[1])
    whole, pred = np.array(step[5:]), np.array(predictor[3:])
    return list(whole - np.median(pred)), list(pred), decode[5:]


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


def ttfc_parts(tts, runs: int):
    """TTFC taken apart as TTSEngine.stream spends it on the megakernel engine, each part synchronized:
    tokenize + build the prompt, prefill, the first frame's launch, the codec's first frame, the copy to host."""
    talker = tts.config.talker
    parts = {name: [] for name in ("prompt", "prefill", "first frame", "codec", "to host")}
    for run in range(runs):
        t = [time.perf_counter()]
        inputs = tts.prompts.build(tts.prompts.text_ids(TEXT), tts.resolve_voice(tts.speakers[0]), True, tts.device)
        torch.cuda.synchronize()
        t.append(time.perf_counter())
        state = tts.model.begin(inputs.prefill.to(tts.dtype), 2)
        torch.cuda.synchronize()
        t.append(time.perf_counter())
        sampler = Sampler(SamplingOptions(), run, talker.decoder.vocab_size, talker.codec_eos_id, tts._suppress)
        codes = next(tts.model.frame_kernel.run(state, sampler, inputs, 2, threading.Event()))
        torch.cuda.synchronize()
        t.append(time.perf_counter())
        pcm = tts.codec.stream().decode(codes[None])
        torch.cuda.synchronize()
        t.append(time.perf_counter())
        pcm.float().cpu().numpy()
        t.append(time.perf_counter())
        for name, a, b in zip(parts, t, t[1:]):
            parts[name].append(1000 * (b - a))
    return parts


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="speech per RTF run")
    args = parser.parse_args()
    folder = checkpoint(args)
    bandwidth = copy_bandwidth_gbs()
    results = {}
    for name, kernel in (("eager", False), ("megakernel", True)):
        tts = load_tts(folder, device="cuda", megakernel=kernel)
        list(zip(range(10), tts.stream(TEXT, tts.speakers[0], seed=0)))  # warm-up (and the kernel's build)
        times = kernel_times(tts, args.frames) if kernel else eager_times(tts, args.frames)
        results[name] = (*times, *stream_times(tts, args.runs, args.seconds))
        if kernel:
            parts = ttfc_parts(tts, max(args.runs, 5))
        if not kernel:
            results["CUDA graph"] = (*graph_times(tts, args.frames), None, None, None)
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
    print("| figure | eager p50 / p95 | CUDA graph p50 / p95 | megakernel p50 / p95 | vs eager | vs graph "
          "| floor | megakernel / floor |")
    print("|---|---|---|---|---|---|---|---|")
    cell = lambda v: f"{np.percentile(v, 50):.3f} / {np.percentile(v, 95):.3f}" if v else "-"  # noqa: E731
    for i, (name, floor) in enumerate(zip(names, floors)):
        e, g, k = (results[c][i] for c in ("eager", "CUDA graph", "megakernel"))
        k50 = np.percentile(k, 50)
        vs_graph = f"{np.percentile(g, 50) / k50:.1f}x" if g else "-"
        tail = f"{floor:.3f} | {k50 / floor:.1f}x" if floor else "- | -"
        print(f"| {name} | {cell(e)} | {cell(g)} | {cell(k)} | {np.percentile(e, 50) / k50:.1f}x "
              f"| {vs_graph} | {tail} |")
    print("\nTTFC taken apart (megakernel engine, each part synchronized, wall clock ms):\n")
    print("| part | p50 | p95 |\n|---|---|---|")
    for name, v in parts.items():
        print(f"| {name} | {np.percentile(v, 50):.3f} | {np.percentile(v, 95):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
