#!/usr/bin/env bash
# bench/decision_work.py on the GPU machine: a pause's decision work (Whisper and the LLMs on CUDA, Smart Turn on the
# CPU) alone and side by side, at Python's switch interval, the loop's and a shorter one, in one call of about two
# minutes; the table goes under $OUT.
#   bash bench/gpu_decision_work.sh   (after the .gpu/ parts are carried, as for bench/gpu_turn_taking.sh)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"

python3 bench/decision_work.py --device cuda --voices "$root/voices" --whisper "$root/whisper" \
    --turn-model "$root/turn/smart-turn-v3.2-cpu.onnx" --switch-ms 5,1,0.2 "$@" 2>&1 | tee "$out/decision_work_gpu.txt"
