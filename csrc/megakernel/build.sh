#!/usr/bin/env bash
# Compiles the kernel with plain nvcc for sm_90a (Hopper) and sm_80 (portable) and prints ptxas's
# register / spill report; fails if nvcc is missing or the kernel does not compile. The Python side
# (engine/tts/megakernel.py) builds the same sources with torch.utils.cpp_extension on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")"
command -v nvcc >/dev/null || { echo "csrc/megakernel/build.sh: nvcc not found (CUDA 12+ needed)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for source in megakernel.cu attention_prologue.cu snake.cu rms_norm.cu swiglu.cu; do
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80 \
    -Xptxas -v -c "$source" -o "$out/${source%.cu}.o" 2>&1 | grep -E "Compiling entry|registers|spill|error|warning"
done
echo "megakernel: compiled for sm_90a and sm_80"
