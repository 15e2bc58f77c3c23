"""GPU benchmark of the streaming codec call (CodecStream.decode): eager PyTorch against the CUDA graph replays
of engine/tts/codec.py, per chunk length, one table.

Method: the speech tokenizer (speech_tokenizer/) of a random-weight checkpoint in the official layout, written
once under --cache with engine.tts.testing.write_checkpoint, on the GPU in --dtype (bf16, the engine's). For
each chunk length, random codes on the GPU; a stream decodes --calls chunks (100 one-frame calls cross the
72-frame attention window). Each call starts on an idle device (synchronize) and is timed by CUDA events around
decode(), so launch gaps count as they do in TTFC; the output stays on the GPU (the engine's copy to host is
not included). "eager" is stream(eager=True), the same code op by op; "graph" the engine's stream: codes copied
in, one replay, output cloned. The graphs are captured by warm_up before, and one whole stream of each kind runs
first as a warm-up; p50 / p95 over the second stream's calls. max |d pcm| is graph against eager on the same
codes. The floor is the decoder's weight bytes (codebook tables excepted: a call gathers a few rows) over the
device-to-device copy bandwidth measured in the same run: each call reads every weight once.

With --megakernel the decoder runs the megakernel's codec kernels (engine.tts.megakernel.attach_codec: SnakeBeta
in one launch), eager and graph alike; a run without it in the same lease is the baseline.

    python bench/codec_gpu.py --size 0.6b [--megakernel]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts.codec import load_codec  # noqa: E402
from engine.tts.megakernel import attach_codec  # noqa: E402
from gpu_bandwidth import copy_bandwidth_gbs  # noqa: E402  (bench/, the script's folder)
from bench_checkpoint import add_arguments as add_checkpoint_arguments, checkpoint  # noqa: E402  (bench/)


def stream_ms(decoder, codes: torch.Tensor, frames: int, eager: bool):
    """ms of each stream.decode() call of `frames` frames over `codes` (CUDA events, idle device before each),
    and the stream's whole audio."""
    stream = decoder.stream(eager=eager)
    times, pieces = [], []
    for start in range(0, len(codes), frames):
        chunk = codes[start : start + frames]
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        pieces.append(stream.decode(chunk))
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return times, torch.cat(pieces)


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--lengths", default="1,4", help="chunk lengths (frames per call), comma-separated")
    parser.add_argument("--calls", type=int, default=100, help="calls per stream")
    parser.add_argument("--megakernel", action="store_true", help="the megakernel's codec kernels (attach_codec)")
    args = parser.parse_args()
    folder = checkpoint(args)
    bandwidth = copy_bandwidth_gbs()
    decoder = load_codec(folder / "speech_tokenizer", device="cuda", dtype=getattr(torch, args.dtype))
    if args.megakernel:
        attach_codec(decoder)
    config = decoder.config
    # a call gathers a few codebook rows; the quantizers' input_proj only serves encoding
    skipped = ("._codebook.", ".input_proj.")
    weight_bytes = sum(p.numel() * p.element_size() for name, p in decoder.named_parameters()
                       if not (name.startswith("quantizer.") and any(s in name for s in skipped)))
    floor = weight_bytes / bandwidth / 1e6
    lengths = [int(v) for v in args.lengths.split(",")]

    captures = []
    for frames in lengths:
        torch.cuda.synchronize()
        t = time.perf_counter()
        decoder.warm_up([frames])
        torch.cuda.synchronize()
        captures.append((frames, 1000 * (time.perf_counter() - t)))

    generator = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for frames in lengths:
        codes = torch.randint(0, config.codebook_size, (args.calls * frames, config.num_quantizers),
                              device="cuda", generator=generator)
        results = {}
        for eager in (True, False):
            stream_ms(decoder, codes, frames, eager)  # warm-up
            results[eager] = stream_ms(decoder, codes, frames, eager)
        (eager_ms, eager_pcm), (graph_ms, graph_pcm) = results[True], results[False]
        delta = (graph_pcm - eager_pcm).abs().max().item()
        rows.append((frames, eager_ms, graph_ms, delta))

    cell = lambda v: f"{np.percentile(v, 50):.3f} / {np.percentile(v, 95):.3f}"  # noqa: E731
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.size} codec, {args.dtype}, "
          f"megakernel's codec kernels {'on' if args.megakernel else 'off'}; "
          f"copy bandwidth {bandwidth:.0f} GB/s, decoder weights {weight_bytes / 1e6:.0f} MB (same run); "
          f"{args.calls} calls a stream\n")
    print("| chunk frames | eager p50 / p95 ms | graph p50 / p95 ms | eager / graph | floor ms | graph / floor "
          "| max \\|d pcm\\| |")
    print("|---|---|---|---|---|---|---|")
    for frames, eager_ms, graph_ms, delta in rows:
        e50, g50 = np.percentile(eager_ms, 50), np.percentile(graph_ms, 50)
        print(f"| {frames} | {cell(eager_ms)} | {cell(graph_ms)} | {e50 / g50:.1f}x | {floor:.3f} | "
              f"{g50 / floor:.1f}x | {delta:.3g} |")
    print("\nCapture by warm_up (3 eager runs + capture, wall clock ms): "
          + ", ".join(f"{frames} frames: {ms:.0f}" for frames, ms in captures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
