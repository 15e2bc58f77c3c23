"""The first script of Parley's PyInstaller bundle (build_app.spec), run before app/__main__.py.

1. multiprocessing.freeze_support(): a process that engine/downloads.py spawns is this same executable
   with --multiprocessing-fork; PyInstaller's hook makes freeze_support() run it and exit, so it never
   opens a second window.
2. `parley --self-test`: checks that the bundle holds what the app needs (the engine's libraries, the
   style and icons, the bundled models, a window that opens, a spawned process that runs), prints one
   line per check and exits 0, or 1 naming what is missing. .ci/build_app runs it after each build.
"""

import multiprocessing
import os
import sys
import tempfile
import traceback

multiprocessing.freeze_support()


def _check_libraries():
    import ctranslate2
    import faster_whisper
    import huggingface_hub
    import llama_cpp
    import onnxruntime
    import soundfile
    import soxr
    import tokenizers
    import torch
    import transformers

    llama_cpp.llama_supports_gpu_offload()  # calls into libllama: the shared library is really there
    torch.zeros(2, 2) @ torch.zeros(2, 2)
    return (f"torch {torch.__version__}, llama.cpp {llama_cpp.__version__}, CTranslate2 {ctranslate2.__version__}, "
            f"faster-whisper {faster_whisper.__version__}, onnxruntime {onnxruntime.__version__}, transformers "
            f"{transformers.__version__}, tokenizers {tokenizers.__version__}, huggingface_hub "
            f"{huggingface_hub.__version__}, soundfile {soundfile.__version__}, soxr {soxr.__version__}")


def _check_audio():
    try:
        import sounddevice
    except OSError as e:  # PortAudio is the system's (Debian: libportaudio2), not the bundle's
        raise RuntimeError(f"{e}; install PortAudio (Debian/Ubuntu: apt install libportaudio2)") from e
    return f"PortAudio {sounddevice.get_portaudio_version()[1]}"


def _check_models():
    from engine.llm.chat import ChatModel, ChatOptions, bundled_model_path
    from engine.models import package_folder
    from engine.stt.vad import SileroVad, silero_model_path
    from engine.stt.whisper import BUNDLED_PARTS

    from engine.stt.turn import TurnModel

    SileroVad()  # an onnxruntime session on faster-whisper's bundled model
    turn = TurnModel()  # and one on the end-of-turn model pipecat-ai carries
    for module, part in BUNDLED_PARTS:
        folder = package_folder(module)
        if folder is None or not (folder / "data" / part).is_file():
            raise RuntimeError(f"the bundled Whisper part {module}/data/{part} is missing")
    chat = ChatModel(bundled_model_path(), ChatOptions(n_threads=1))  # llama.cpp loads the GGUF
    tokens = chat.count_tokens("Hello from the bundle.")
    return (f"Silero VAD {silero_model_path().name}, {turn.path.name}, Whisper base (bundled), "
            f"{bundled_model_path().name} ({tokens} tokens)")


def _check_window():
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings
    from app.style import apply_style

    app = QApplication.instance() or QApplication([sys.argv[0]])
    scheme = apply_style(app, "system")
    if app.windowIcon().pixmap(64, 64).isNull():
        raise RuntimeError("the app icon did not load (assets/icon.svg, icon.png)")
    with tempfile.TemporaryDirectory() as folder:
        window = MainWindow(Settings(QSettings(os.path.join(folder, "parley.ini"), QSettings.Format.IniFormat)))
        window.show()
        app.processEvents()
        shown = window.isVisible()
        window.close()
        app.processEvents()
    if not shown:
        raise RuntimeError("the main window did not show")
    return f"main window on Qt platform '{app.platformName()}', {scheme} scheme"


def _check_spawn():
    child = multiprocessing.get_context("spawn").Process(target=os.getpid)
    child.start()
    child.join(60)
    if child.exitcode != 0:
        raise RuntimeError(f"a spawned process (as downloads use) exited with {child.exitcode}")
    return "a spawned process ran and exited 0"


def self_test() -> int:
    failed = 0
    for name, check in (("libraries", _check_libraries), ("audio", _check_audio), ("models", _check_models),
                        ("window", _check_window), ("processes", _check_spawn)):
        try:
            print(f"ok    {name}: {check()}", flush=True)
        except Exception as e:  # every check runs; the summary names each failure
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
    print("self-test passed" if not failed else f"self-test: {failed} check(s) failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__" and "--self-test" in sys.argv[1:]:
    sys.exit(self_test())
