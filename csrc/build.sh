#!/usr/bin/env bash
# Compiles the kernels with plain nvcc for sm_90a (Hopper) and sm_80 (portable) and prints ptxas's
# register / spill report; fails if nvcc is missing or a kernel does not compile. The Python side
# (engine/tts/kernels/build.py) builds the same sources, with binding.cpp, by torch.utils.cpp_extension on a
# GPU machine.
set -euo pipefail
cd "$(dirname "$0")"
command -v nvcc >/dev/null || { echo "csrc/build.sh: nvcc not found (CUDA 12+ needed)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for source in megakernel/megakernel.cu fused/attention_prologue.cu fused/snake.cu fused/rms_norm.cu fused/swiglu.cu; do
  name=$(basename "$source" .cu)
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80 \
    -Xptxas -v -c "$source" -o "$out/$name.o" 2>&1 | grep -E "Compiling entry|registers|spill|error|warning"
done
echo "kernels: compiled for sm_90a and sm_80"
