"""What fusing the elementwise chains of the codec stream call and of the talker prefill would be worth on the GPU:
the engine's CUDA graphs against graphs of the same code compiled by torch.compile (inductor), which fuses them.

The engine does not compile (a first start would take minutes: the table's compile column); this measures the
headroom for kernels of its own. Method: a random-weight checkpoint in the official layout (written once under
--cache), loaded by load_tts on CUDA in bf16 without the megakernel. For each codec chunk length, the decoder is
compiled and captured on a StreamState of its own the way engine/tts/codec.py ChunkGraphs captures it; for the
prefill bucket, the talker stack likewise, on PaddedPrefill's static buffers. Each replay is timed by CUDA events
on an idle device, --calls of them, p50. max |d| compares the compiled graph's output with the engine's graph's
on the same input: a codec stream of 40 random frames; a random bf16 prompt of bucket - 4 rows (the final-normed
hidden state and the keys written).

    python bench/fusion_headroom.py --size 0.6b [--lengths 1,4] [--bucket 32] [--dynamic]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import load_tts  # noqa: E402
from engine.tts.codec import StreamState  # noqa: E402
from engine.tts.graphs import GraphSet  # noqa: E402
from engine.tts.prefill import PaddedPrefill  # noqa: E402
from bench_checkpoint import add_arguments as add_checkpoint_arguments, checkpoint  # noqa: E402  (bench/)
from tts_gpu import timed  # noqa: E402  (bench/)


def replay_p50(call, calls: int) -> float:
    """p50 ms of call(), each on an idle device."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        times.append(timed(call)[1])
    return float(np.median(times))


def codec_row(tts, frames: int, compiled, calls: int) -> list[str]:
    decoder = tts.codec
    codes = torch.randint(0, decoder.config.codebook_size, (40, decoder.config.num_quantizers), device="cuda",
                          generator=torch.Generator(device="cuda").manual_seed(0))
    stream = decoder.stream()
    reference = torch.cat([stream.decode(codes[i:i + frames]) for i in range(0, len(codes), frames)])
    stream = decoder.stream()
    engine_ms = replay_p50(lambda: stream.decode(codes[:frames]), calls)

    start = time.perf_counter()
    state, inputs = StreamState(decoder), torch.zeros_like(codes[:frames])
    graph, pcm = GraphSet(inputs.device).capture(
        frames, run=lambda: compiled(inputs, state), warm_up=lambda: compiled(inputs, StreamState(decoder)))
    compile_s = time.perf_counter() - start
    pieces = []
    for i in range(0, len(codes), frames):
        inputs.copy_(codes[i:i + frames])
        graph.replay()
        pieces.append(pcm.clone())
    difference = float((torch.cat(pieces) - reference).abs().max())
    compiled_ms = replay_p50(lambda: (inputs.copy_(codes[:frames]), graph.replay(), pcm.clone()), calls)
    return [f"codec stream call, {frames} frame(s)", f"{engine_ms:.3f}", f"{compiled_ms:.3f}",
            f"{engine_ms / compiled_ms:.2f}x", f"{compile_s:.0f}",
            f"pcm {difference:.4f} (rms {float(reference.pow(2).mean().sqrt()):.3f})"]


def prefill_row(tts, bucket: int, dynamic: bool, calls: int) -> list[str]:
    stack = tts.model.talker.model
    prompt = torch.randn(bucket - 4, stack.cfg.hidden_size, device="cuda", dtype=torch.bfloat16,
                         generator=torch.Generator(device="cuda").manual_seed(0))
    engine = tts.model.padded_prefill
    state = engine.begin(prompt, 1)
    hidden, keys = state.hidden, state.cache.k[:, :, : len(prompt)]
    engine_ms = replay_p50(lambda: engine.run(bucket), calls)

    ours, compiled = PaddedPrefill(tts.model, (bucket,)), torch.compile(stack, dynamic=dynamic)
    ours.x[: len(prompt)].copy_(prompt)
    ours.last.fill_(len(prompt) - 1)

    def run():
        ours.cache.length = 0
        return compiled(ours.x[:bucket], ours.cache).index_select(0, ours.last)[0]

    start = time.perf_counter()
    graph, compiled_hidden = GraphSet(prompt.device).capture(bucket, run)
    compile_s = time.perf_counter() - start
    graph.replay()
    d_hidden = float((compiled_hidden.float() - hidden.float()).abs().max())
    d_keys = float((ours.cache.k[:, :, : len(prompt)].float() - keys.float()).abs().max())
    compiled_ms = replay_p50(graph.replay, calls)
    return [f"talker prefill, {bucket}-row bucket", f"{engine_ms:.3f}", f"{compiled_ms:.3f}",
            f"{engine_ms / compiled_ms:.2f}x", f"{compile_s:.0f}",
            f"hidden {d_hidden:.4f} (max {float(hidden.abs().max()):.2f}), keys {d_keys:.4f}"]


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--lengths", default="1,4", help="codec chunk lengths (frames a call)")
    parser.add_argument("--bucket", type=int, default=32, help="prefill bucket (rows)")
    parser.add_argument("--dynamic", action="store_true", help="one compilation across shapes, not one a shape")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    tts = load_tts(checkpoint(args), device="cuda", megakernel=False)
    compiled_codec = torch.compile(tts.codec, dynamic=args.dynamic)
    with torch.inference_mode():
        rows = [codec_row(tts, int(n), compiled_codec, args.calls) for n in args.lengths.split(",")]
        rows.append(prefill_row(tts, args.bucket, args.dynamic, args.calls))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.size} bf16, "
          f"{'dynamic' if args.dynamic else 'static'} shapes\n")
    print("| graph | engine p50 ms | compiled p50 ms | engine / compiled | compile + capture s | max \\|d\\| |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
