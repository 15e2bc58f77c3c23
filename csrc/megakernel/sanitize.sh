#!/usr/bin/env bash
# compute-sanitizer's memcheck and racecheck on the megakernel's launches (GPU machine): a tiny random
# checkpoint speaks through the engine, once on the frame kernel and once (top_p < 1) on the
# decoder-step kernel. Only that run's kernel is instrumented, so torch's own stay fast.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -m engine.tts.testing make-checkpoint "$dir/tiny" --size tiny >/dev/null
speak() {
  echo "from engine.tts import load_tts, SamplingOptions
t = load_tts('$dir/tiny', device='cuda')
print('samples', sum(c.pcm.size for c in t.stream('A sanitizer check.', t.default_speaker, seed=1, sampling=SamplingOptions(top_p=$1))))"
}
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --kernel-name kns=frames_kernel --error-exitcode 1 python3 -c "$(speak 1.0)"
  compute-sanitizer --tool "$tool" --kernel-name kns=decoder_step_kernel --error-exitcode 1 python3 -c "$(speak 0.9)"
done
echo "sanitizer: clean"
