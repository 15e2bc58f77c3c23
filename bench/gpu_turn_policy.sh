#!/usr/bin/env bash
# bench/turn_policy.py on the GPU machine: the 48 turns' pause decisions with Whisper on CUDA, in float16 (the app's)
# and then in float32, in one call of about two minutes; the tables go under $OUT. The GPU turn-taking runs' cut-offs
# were float16 readings of hanging voices as finished sentences: this says whether float32 reads fewer so.
#   bash bench/gpu_turn_policy.sh   (after the .gpu/ parts are carried, as for bench/gpu_turn_taking.sh)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"

for precision in "" --float32; do
    python3 bench/turn_policy.py --device cuda $precision --voices "$root/voices" --whisper "$root/whisper" \
        --turn-model "$root/turn/smart-turn-v3.2-cpu.onnx" -v 2>&1 | tee -a "$out/turn_policy_gpu.txt"
done
