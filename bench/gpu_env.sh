# Sourced by bench/gpu_voice_loop.sh and bench/gpu_turn_taking.sh on the GPU machine (no network, no sound
# server, no PortAudio): unpacks what bench/gpu_voice_loop_prep.sh packed into .gpu/ (carried there over several
# calls: see its header) into $root, points Python and the CUDA libraries at it, and writes machine.txt under $out.
# Exits 3, at once, when a part is missing or damaged.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp/parley-gpu-out}
mkdir -p "$out"
root=/tmp/parley-gpu

if [ ! -d "$root/site" ]; then
    if ! (cd .gpu 2>/dev/null && sha256sum --quiet -c SHA256SUMS); then
        echo "gpu_env: .gpu/ lacks parts or SHA256SUMS (the machine went back between calls?): $(ls .gpu 2>/dev/null | tr '\n' ' ')" >&2
        exit 3
    fi
    mkdir -p "$root"
    cat .gpu/part.* | xz -d -T0 | tar -C "$root" -xf - || exit 3
fi
export PYTHONPATH="$root/site:$PWD" PYTHONUNBUFFERED=1
# the megakernel, once built, is kept beside the unpacked parts for the next call on the same machine
export XDG_CACHE_HOME="$root/cache"

# CUDA 13's cuBLAS and runtime, from the machine's torch: ggml's CUDA backend links them. CTranslate2 4.8's
# wheel was built for CUDA 12 and dlopens libcublas.so.12 by that name; CUDA 12's cuBLAS is a 580 MB wheel,
# past what a call carries, so the name points at CUDA 13's. The nine cuBLAS functions CTranslate2 calls
# (cublasCreate_v2, cublasGemmEx, cublasGemmStridedBatchedEx, cublasSgemm_v2, ...; `strings` on its
# library lists them) keep their signatures in cuBLAS 13. A user's machine with CUDA 12 needs none of this.
cuda_lib=$(python3 -c 'import pathlib, sys
for p in sys.path:
    for hit in pathlib.Path(p or ".").glob("nvidia/*/lib/libcublas.so.13"):
        print(hit.parent); raise SystemExit' 2>/dev/null)
if [ -n "$cuda_lib" ]; then
    mkdir -p "$root/cuda12"
    ln -sf "$cuda_lib/libcublas.so.13" "$root/cuda12/libcublas.so.12"
    export LD_LIBRARY_PATH="$cuda_lib:$root/cuda12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuBLAS 13 from $cuda_lib, also as libcublas.so.12 for CTranslate2"
else
    echo "no libcublas.so.13 beside torch: Whisper and the LLM may fall back to the CPU" >&2
fi

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'
    nproc
} 2>&1 | tee "$out/machine.txt"
