#!/usr/bin/env bash
# bench/turn_taking.py on the GPU machine: the 48 spoken turns with Whisper, the LLM and the speech model on CUDA and
# the software sound card; the table and the JSON go under $OUT. A configuration of 48 turns takes about 6 minutes
# of wall time (the speech is played at its own pace), so a device call runs one or two: --configs says which.
#   bash bench/gpu_turn_taking.sh --configs fixed   (then --configs early, ... on the same machine)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"

python3 bench/turn_taking.py --device cuda --audio virtual --voices "$root/voices" --whisper "$root/whisper" \
    --turn-model "$root/turn/smart-turn-v3.2-cpu.onnx" --json "$out/turn_taking_gpu.json" "$@" 2>&1 \
    | tee "$out/turn_taking_gpu.txt"
