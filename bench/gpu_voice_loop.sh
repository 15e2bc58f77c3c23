#!/usr/bin/env bash
# bench/voice_loop.py on the GPU machine: the 20-turn loop with the 0.6B TTS, Whisper and the LLM on CUDA, the
# software sound card and 4 llama.cpp threads (for whatever stays on the CPU); the table and the JSON go under $OUT.
#   bash bench/gpu_voice_loop.sh [extra bench/voice_loop.py arguments]
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"

python3 bench/voice_loop.py --device cuda --size 0.6b --audio virtual --voices "$root/voices" \
    --whisper "$root/whisper" --llm-threads 4 --json "$out/voice_loop_gpu.json" "$@" 2>&1 | tee "$out/voice_loop_gpu.txt"
