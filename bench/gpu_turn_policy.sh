#!/usr/bin/env bash
# bench/turn_policy.py on the GPU machine: the 48 turns' pause decisions with Whisper on CUDA in float16 (the app's),
# with and without the words' meaning (engine/stt/turn_text.py), in one call of about a minute; the table goes under
# $OUT. (Whisper in float32 there read every turn as float16 did: docs/BENCHMARKS.md.)
#   bash bench/gpu_turn_policy.sh   (after the .gpu/ parts are carried, as for bench/gpu_turn_taking.sh)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"

python3 bench/turn_policy.py --device cuda --voices "$root/voices" --whisper "$root/whisper" \
    --turn-model "$root/turn/smart-turn-v3.2-cpu.onnx" -v "$@" 2>&1 | tee "$out/turn_policy_gpu.txt"
