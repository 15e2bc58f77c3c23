#!/usr/bin/env bash
# Builds bench/matvec_stages.cu with nvcc and runs it on this machine's GPU: what one stage of the
# megakernel's decode step costs alone, in the kernel's own design and in others (see the .cu file's
# header). --compile-only builds it and stops (CI: the bench uses the kernel's own helpers, so a change to
# them that breaks it fails there).
set -euo pipefail
cd "$(dirname "$0")"
command -v nvcc >/dev/null || { echo "bench/matvec_stages.sh: nvcc not found" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80 \
  matvec_stages.cu -o "$out/matvec_stages"
if [ "${1:-}" = "--compile-only" ]; then echo "bench/matvec_stages.cu: compiled"; exit 0; fi
"$out/matvec_stages"
