"""What a pause's decision waits for, alone and side by side as the voice loop runs it: Whisper's transcript of the
pause, the end-of-turn model's answer (Smart Turn v3.2) and the words' reading (engine/stt/turn_text.py), each alone,
then Whisper and Smart Turn together, then the two with an LLM reply streaming beside them (the loop's early reply).

Method: bench/turn_taking.py's first 24 turns as the VAD hands a pause over: the line's espeak-ng speech up to its first
pause (the whole line where it has none) and VadOptions.tail_ms (200 ms) of quiet after it. Each arrangement times
every pause once, after one warm-up, in each switch interval asked (sys.setswitchinterval: how long a thread running
Python keeps Python's lock from one waiting for it). Whisper transcribes as a turn's transcript does (language detected,
the verbatim prompt); the reply is the bundled SmolLM2's to the pause's words, 24 tokens, greedy. Printed: the median
and 95th percentile of each step's milliseconds. On a GPU machine the decision is as slow as its slowest step side by
side; the gap between alone and side by side is what the threads cost each other.

    python bench/decision_work.py [--device cuda] [--switch-ms 5,1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from turn_taking import script  # noqa: E402
from virtual_audio import MIC_NOISE_RMS  # noqa: E402
from voice_loop import load_transcriber, speech  # noqa: E402

from engine.llm.chat import ChatModel, ChatOptions, bundled_model_path  # noqa: E402
from engine.stt import SAMPLE_RATE_HZ  # noqa: E402
from engine.stt.turn import TurnModel, default_threads  # noqa: E402
from engine.stt.turn_text import TextTurnModel  # noqa: E402
from engine.stt.vad import VadOptions  # noqa: E402

# the steps started together in each arrangement; none: each step alone, one after another
ARRANGEMENTS = {"alone": (), "whisper + smart turn": ("whisper", "smart turn"),
                "whisper + smart turn + reply": ("whisper", "smart turn", "reply")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where Whisper and the LLMs run")
    parser.add_argument("--switch-ms", default="5,1", help="switch intervals, comma-separated")
    parser.add_argument("--turns", type=int, default=24, help="the first N turns of bench/turn_taking.py's script")
    parser.add_argument("--voices", help="folder of the lines' speech (default: a temporary one)")
    parser.add_argument("--whisper", help="a CTranslate2 Whisper folder (default: the bundled base)")
    parser.add_argument("--turn-model", help="the Smart Turn ONNX file (default: pipecat-ai's)")
    args = parser.parse_args(argv)
    voices = Path(args.voices or tempfile.mkdtemp(prefix="parley-decision-"))
    rng = np.random.default_rng(0)
    tail = round(VadOptions.tail_ms * SAMPLE_RATE_HZ / 1000)
    pauses = []
    for _, parts in script()[: args.turns]:
        voice = speech(parts[0][0], voices)
        quiet = rng.normal(0, MIC_NOISE_RMS, tail).astype(np.float32)  # the software microphone's noise floor
        pauses.append((parts[0][0], np.concatenate([voice, quiet])))

    whisper = load_transcriber(args)
    voice_model = TurnModel(args.turn_model)
    chat = ChatModel(bundled_model_path(), ChatOptions(n_ctx=2048, max_tokens=24, temperature=0.0, n_threads=1,
                                                       n_gpu_layers=None if args.device == "cuda" else 0))
    reader = TextTurnModel(threads=default_threads(), gpu_layers=chat.n_gpu_layers)
    steps = {
        "whisper": lambda text, audio: whisper.transcribe(audio),
        "smart turn": lambda text, audio: voice_model.probability(audio),
        "reading": lambda text, audio: reader.reading(text),
        "reply": lambda text, audio: "".join(chat.stream_reply(text)),
    }
    # first calls' costs (CUDA kernels, caches) out of the figures, on the last pause: Whisper keeps its last
    # encoding, which the first timed pause must not find
    for step in steps.values():
        step(*pauses[-1])
    chat.clear_history()

    print(f"{len(pauses)} pauses, --device {args.device}, Whisper {whisper.device} {whisper.compute_type}, "
          f"Smart Turn {default_threads()} threads, LLM {chat.n_gpu_layers} GPU layers\n")
    print("| switch ms | arrangement | step | p50 ms | p95 ms |\n|---|---|---|---|---|")
    for switch_ms in (float(s) for s in args.switch_ms.split(",")):
        sys.setswitchinterval(switch_ms / 1000)
        for arrangement, together in ARRANGEMENTS.items():
            times: dict[str, list[float]] = {}
            for text, audio in pauses:
                if together:
                    for name, ms in side_by_side({n: steps[n] for n in together}, text, audio).items():
                        times.setdefault(name, []).append(ms)
                else:
                    for name, step in steps.items():
                        times.setdefault(name, []).append(timed(step, text, audio))
                chat.clear_history()
            for name, ms in times.items():
                print(f"| {switch_ms:g} | {arrangement} | {name} | {np.percentile(ms, 50):.0f} | "
                      f"{np.percentile(ms, 95):.0f} |", flush=True)
    return 0


def timed(step, text: str, audio: np.ndarray) -> float:
    t0 = time.perf_counter()
    step(text, audio)
    return (time.perf_counter() - t0) * 1000


def side_by_side(steps: dict, text: str, audio: np.ndarray) -> dict[str, float]:
    """Each step's milliseconds with all of them started together on threads of their own."""
    start, times = threading.Barrier(len(steps)), {}

    def run(name, step):
        start.wait()
        times[name] = timed(step, text, audio)

    threads = [threading.Thread(target=run, args=item) for item in steps.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return times


if __name__ == "__main__":
    sys.exit(main())
