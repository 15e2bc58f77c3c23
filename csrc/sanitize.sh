#!/usr/bin/env bash
# compute-sanitizer's memcheck and racecheck on the kernels' launches (GPU machine), on a tiny random
# checkpoint. Only the named kernel is instrumented, so torch's own stay fast.
# memcheck: the engine speaks, once on the frame kernel and once (top_p < 1) on the decoder-step kernel, and on
# the fused kernels beside them (the prefill's attention prologue, RMSNorm and SwiGLU, the codec's SnakeBeta).
# racecheck: the two persistent kernels, in a process that runs no cuBLAS GEMM: racecheck does not survive one on
# this GPU ("Internal Sanitizer Error: failed to handle a hardware exception" at the first Hopper GEMM, before the
# megakernel ever runs), so the frame kernel's prompt and prefill are made beforehand in a process of their own,
# and the engine loads without its CUDA graphs (their capture runs GEMMs).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -m engine.tts.testing make-checkpoint "$dir/tiny" --size tiny >/dev/null
speak() {
  echo "from engine.tts import load_tts, SamplingOptions
t = load_tts('$dir/tiny', device='cuda')
print('samples', sum(c.pcm.size for c in t.stream('A sanitizer check.', t.default_speaker, seed=1, sampling=SamplingOptions(top_p=$1))))"
}
load() {
  echo "import threading, torch
from unittest import mock
from engine.tts import SamplingOptions, load_tts
from engine.tts.codec import CodecDecoder
from engine.tts.model import KVCache
from engine.tts.sampling import Sampler
with mock.patch('engine.tts.stream.attach_graphs'), mock.patch.object(CodecDecoder, 'warm_up'):
    t = load_tts('$dir/tiny', device='cuda')
talker = t.config.talker"
}
prefill() {
  echo "$(load)
inputs = t.prompts.build(t.prompts.text_ids('A sanitizer check.'), t.resolve_voice(t.default_speaker), True, t.device)
torch.save((inputs, t.model.begin(inputs.prefill.to(t.dtype), 9)), '$dir/prefill.pt')"
}
launch() {
  echo "$(load)
if '$1' == 'frames_kernel':
    inputs, state = torch.load('$dir/prefill.pt', weights_only=False)
    sampler = Sampler(SamplingOptions(), 1, talker.decoder.vocab_size, talker.codec_eos_id, t._suppress, min_frames=10**9)
    print('frames', sum(1 for _ in t.model.frame_kernel.run(state, sampler, inputs, 9, threading.Event(), 4)))
else:
    stack = t.model.talker.model
    cache = KVCache(stack.cfg, 16, 'cuda', torch.bfloat16)
    for _ in range(8):
        stack(torch.randn(1, stack.cfg.hidden_size, device='cuda', dtype=torch.bfloat16), cache)
    print('steps', cache.length)"
}
python3 -c "$(prefill)"
for kernel in frames_kernel decoder_step_kernel; do
  top_p=$([ $kernel = frames_kernel ] && echo 1.0 || echo 0.9)
  compute-sanitizer --tool memcheck --kernel-name kns=$kernel --error-exitcode 1 python3 -c "$(speak $top_p)"
  compute-sanitizer --tool racecheck --kernel-name kns=$kernel --error-exitcode 1 python3 -c "$(launch $kernel)"
done
# the fused kernels: memcheck as the engine speaks (no racecheck: GEMMs run)
for kernel in attention_prologue_kernel snake_kernel rms_norm_kernel swiglu_kernel; do
  compute-sanitizer --tool memcheck --kernel-name kns=$kernel --error-exitcode 1 python3 -c "$(speak 1.0)"
done
echo "sanitizer: clean"
