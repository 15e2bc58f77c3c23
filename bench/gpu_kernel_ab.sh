#!/usr/bin/env bash
# A change to the megakernel or to the streams around it, checked on the GPU machine in one device call of about
# 5 minutes: the working tree against a baseline tree exported beside it (its engine/, csrc/ and bench/). Both kernels
# are built (at once), then the working tree's exactness tests (the frame and batch kernels' codes, the streams' solo
# speech), `bench/megakernel_ab.py` (frames of the two kernels, alternated) and `bench/tts_streams.py` in each tree.
# Each step has its own timeout and is tee'd under $OUT as it goes, so a cut-off call still leaves what came before:
# machine.txt, build.txt, build_base.txt, tests.txt, ab.txt, streams.txt, streams_base.txt.
#
#   mkdir -p .dev/base && git archive <baseline revision> engine csrc bench | tar -x -C .dev/base
#   bash bench/gpu_kernel_ab.sh .dev/base        carry: .whl, .dev
#
# The wheels in .whl/ are those bench/gpu_dataflow.sh names (that machine lacks the transformers stack the engine
# pins, and has no network). A second argument replaces the tests' -k expression.
set -uo pipefail
cd "$(dirname "$0")/.."
base=${1:?"usage: bash bench/gpu_kernel_ab.sh BASE_TREE [PYTEST_K]"}
tests=${2:-"frames_give or batched or streams"}
out=${OUT:-/tmp/parley-gpu-out}
mkdir -p "$out"
[ -d "$base/csrc" ] || { echo "gpu_kernel_ab: $base has no csrc/: export the baseline there first" >&2; exit 2; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export XDG_CACHE_HOME=/tmp/parley-cache  # the built kernels are kept there (by their sources' hash) between calls
site=/tmp/parley-site
[ -d "$site/transformers" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
start=$SECONDS
step() { echo "$1: $((SECONDS - start)) s" | tee -a "$out/machine.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/machine.txt"
build='from engine.tts.kernels.build import build; build(); print("built")'
(cd "$base" && PYTHONPATH="$site" timeout 240 python3 -c "$build" > "$out/build_base.txt" 2>&1) &
PYTHONPATH="$site" timeout 240 python3 -c "$build" 2>&1 | tail -3 | tee "$out/build.txt"
wait
step built
PYTHONPATH="$site" timeout 240 python3 -m pytest -q -p no:cacheprovider tests/tts/test_megakernel.py \
    tests/tts/test_turns.py -k "$tests" 2>&1 | tail -8 | tee "$out/tests.txt"
step tested
PYTHONPATH="$site" timeout 150 python3 bench/megakernel_ab.py --base "$base" --size 0.6b --cache /tmp/parley-bench \
    2>&1 | tail -6 | tee "$out/ab.txt"
step compared
for tree in . "$base"; do
    name=$([ "$tree" = . ] && echo streams || echo streams_base)
    (cd "$tree" && PYTHONPATH="$site:$PWD" timeout 90 python3 bench/tts_streams.py --size 0.6b --device cuda \
        --streams 1,4,8,16 --joiners 4 2>&1 | tail -7 | tee "$out/$name.txt")
    step "$name"
done
