#!/usr/bin/env bash
# bench/voice_loop.py on the GPU machine (no network, no sound server, no PortAudio): unpacks what
# bench/gpu_voice_loop_prep.sh packed into .gpu/ (carried there over several calls: see its header),
# then runs the 20-turn loop with the 0.6B TTS on CUDA, the software sound card and 4 llama.cpp
# threads (16 cores there; Whisper takes them all when it falls back to the CPU), and writes the
# table and the JSON under $OUT. Exits 3, at once, when a part is missing or damaged.
#   bash bench/gpu_voice_loop.sh [extra bench/voice_loop.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/parley-gpu-out}
mkdir -p "$out"
root=/tmp/parley-gpu

if [ ! -d "$root/site" ]; then
    if ! (cd .gpu 2>/dev/null && sha256sum --quiet -c SHA256SUMS); then
        echo "gpu_voice_loop: .gpu/ lacks parts or SHA256SUMS (the machine went back between calls?): $(ls .gpu 2>/dev/null | tr '\n' ' ')" >&2
        exit 3
    fi
    mkdir -p "$root"
    cat .gpu/part.* | xz -d -T0 | tar -C "$root" -xf - || exit 3
fi
export PYTHONPATH="$root/site:$PWD" PYTHONUNBUFFERED=1

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'
    nproc
} 2>&1 | tee "$out/machine.txt"

python3 bench/voice_loop.py --device cuda --size 0.6b --audio virtual --voices "$root/voices" \
    --whisper "$root/whisper" --llm-threads 4 --json "$out/voice_loop_gpu.json" "$@" 2>&1 | tee "$out/voice_loop_gpu.txt"
