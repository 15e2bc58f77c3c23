"""Benchmark of turn-taking: how soon Parley answers once the user has finished, and how often it cuts them off in a
pause for thought, with the fixed silence window (the baseline), end-of-turn detection, end-of-turn detection with
the reply begun in the pause (the default), the same with the voice's model alone (not the words' meaning:
engine/stt/turn_text.py), and the same with the live transcript the app shows, in the same run.

Method: bench/voice_loop.py's parts (a private PulseAudio with the 'vsink' speakers and the 'usermic' microphone,
espeak-ng's en-us voice at 150 words a minute; or --audio virtual) drive the real loop hands-free: Silero VAD -> the
Endpointer (with or without engine/stt/turn.py's and turn_text.py's models) -> Whisper base -> SmolLM2 -> the tiny
random-weight speech model (each clause capped at --max-frames) -> the Player. The script has 48 turns: 12
statements, 12 questions, 12 sentences with a pause in the middle (400-1,200 ms: "I want to book a table for ...
four people"), 12 with a filler and a pause ("so, um ... what is a good book?"); the pauses are silence between
espeak-ng's parts. Each turn is played into the microphone; once it has played, the loop is waited on until it has
listened, idle, for --settle-s (longer than the longest pause, so a turn that is still open ends first). A turn the
loop heard as more than one is a false cut-off. Response latency is engine/metrics.py's voice-to-voice (the block
holding the last speech -> the reply's first sample handed to the sound card) of the turn's last part. Each
configuration runs the whole script on the same models, the fixed window first; "replies begun early" counts the
measured turns whose reply the LLM had begun in the pause (TurnMetrics.early_reply). PulseAudio's null sinks run on
a slow clock (~50-75% of real time here), which stretches the pauses in wall time, and so the fixed window's
latency; the virtual sound card (--audio virtual) keeps wall-clock pace.

    python bench/turn_taking.py                     # CPU, every configuration, 48 turns each
    bash bench/gpu_turn_taking.sh --configs fixed   # on the GPU machine (bench/gpu_voice_loop_prep.sh packs it)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from voice_loop import USER_RATE_HZ, Pulse, VirtualAudio, load_transcriber, random_checkpoint, speech  # noqa: E402

from engine.stt.vad import VadOptions  # noqa: E402  (it leaves sounddevice unimported: the audio is set up first)

# the fixed window, end-of-turn detection, the same + early reply, the same + the live transcript (as the app has it)
CONFIGS = ("fixed", "detection", "early", "voice", "live")

STATEMENTS = [
    "I had a long day at work today.", "My sister is visiting next week.", "The garden needs watering.",
    "I finished reading the book you suggested.", "We are out of milk.", "The train was late again this morning.",
    "I want to learn to play the piano.", "It is raining outside.", "I moved to a new flat last month.",
    "My phone battery is almost empty.", "The meeting went well.", "I would like some music.",
]
QUESTIONS = [
    "What is the capital of Spain?", "How far away is the moon?", "Can you tell me a joke?",
    "What should I cook for dinner?", "How do plants grow?", "What time is it in London?",
    "Is it going to rain tomorrow?", "What is a good name for a cat?", "How many legs does a spider have?",
    "Why is the sky blue?", "Who painted the Mona Lisa?", "What is the largest animal?",
]
PAUSED = [  # (first part, pause in seconds, second part)
    ("I want to book a table for", 0.8, "four people tonight."), ("The best time to call me is", 1.0, "after six."),
    ("Could you remind me to", 0.6, "buy some bread?"), ("My favourite colour is", 1.2, "dark green."),
    ("I think the answer is", 0.9, "forty two."), ("Tomorrow I need to", 0.7, "see the dentist."),
    ("Please play something by", 1.1, "a jazz band."), ("The capital of France is", 0.5, "Paris, right?"),
    ("I am looking for a recipe with", 0.8, "potatoes and leeks."), ("Can you tell me the", 1.0, "weather today?"),
    ("We are going on holiday to", 0.4, "Portugal in May."), ("My brother just bought a", 0.9, "red bicycle."),
]
FILLERS = [  # (first part, pause in seconds, second part)
    ("So, um", 1.0, "what is a good book to read?"), ("Well, let me think, uh", 1.2, "how about a walk?"),
    ("I was wondering, um", 0.8, "can you set a timer?"), ("Hmm, so", 0.9, "what should I wear today?"),
    ("Okay, and, uh", 1.0, "how long do eggs boil?"), ("Right, so, um", 1.1, "tell me about Mars."),
    ("Let me see, er", 0.7, "what day is it?"), ("And then, um", 1.0, "who won the match?"),
    ("Well, uh", 0.6, "is the shop open?"), ("So, you know", 0.9, "I need a new phone."),
    ("Um, actually", 1.2, "never mind the music."), ("Uh, wait", 0.8, "how cold is it outside?"),
]


def script() -> list[tuple[str, list[tuple[str, float]]]]:
    """(kind, [(text, pause after it in s), ...]) of every turn, the kinds interleaved."""
    turns = []
    for statement, question, paused, filler in zip(STATEMENTS, QUESTIONS, PAUSED, FILLERS, strict=True):
        turns += [("statement", [(statement, 0.0)]), ("question", [(question, 0.0)]),
                  ("paused", [(paused[0], paused[1]), (paused[2], 0.0)]),
                  ("filler", [(filler[0], filler[1]), (filler[2], 0.0)])]
    return turns


def utterance(parts: list[tuple[str, float]], voices: Path) -> np.ndarray:
    """The turn's speech as (n,) float32 at 16 kHz: its parts with their pauses between them."""
    pieces = []
    for text, pause in parts:
        pieces += [speech(text, voices), np.zeros(round(pause * USER_RATE_HZ), np.float32)]
    return np.concatenate(pieces)


class Watch:
    """The loop's events of the turn being played: Heard texts, finished turns' figures, and the state."""

    def __init__(self):
        self.lock = threading.Condition()
        self.heard: list[str] = []
        self.finished: list = []
        self.state = "idle"
        self.changed_at = time.monotonic()

    def __call__(self, event) -> None:
        from engine.events import Heard, StateChanged, TurnFailed, TurnFinished

        with self.lock:
            if isinstance(event, Heard):
                self.heard.append(event.text)
            elif isinstance(event, (TurnFinished, TurnFailed)):
                self.finished.append(event)
            elif isinstance(event, StateChanged):
                self.state, self.changed_at = event.state, time.monotonic()
            self.lock.notify_all()

    def reset(self) -> None:
        with self.lock:
            self.heard, self.finished = [], []

    def settle(self, quiet_s: float, timeout_s: float) -> bool:
        """Waits until the loop has been listening, idle, for quiet_s with every heard turn finished."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while True:
                quiet = (self.state == "listening" and len(self.finished) >= len(self.heard)
                         and time.monotonic() - self.changed_at >= quiet_s)
                if quiet and self.heard:
                    return True
                if time.monotonic() >= deadline:
                    return False
                self.lock.wait(0.05)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_config(name: str, dialogue, mic, audio, turns, voices, args, turn_model, text_model, early_reply: bool,
               partials: bool, tail_ms: int, trace=None) -> dict:
    from engine.events import TurnFinished
    from engine.listening import VoiceOptions
    from engine.voice_loop import VoiceLoop

    vad = VadOptions(silence_ms=args.longest_pause_ms if turn_model is not None else args.silence_ms, tail_ms=tail_ms)
    watch = Watch()
    latency, cut, early = [], {"paused": 0, "filler": 0}, 0
    options = VoiceOptions(vad=vad, barge_in=False, early_reply=early_reply, partials=partials)
    with VoiceLoop(dialogue, mic, options=options, turn_model=turn_model, text_model=text_model) as loop:
        loop.subscribe(watch)
        loop.start()
        if args.switch_ms is not None:  # after start(), which sets the loop's own
            sys.setswitchinterval(args.switch_ms / 1000)
        for i, (kind, parts) in enumerate(turns):
            watch.reset()
            began = time.perf_counter()
            audio.play(utterance(parts, voices)).wait()
            if not watch.settle(args.settle_s, args.timeout_s):
                print(f"{name}: turn {i} ({kind}) did not settle within {args.timeout_s:.0f} s: heard {watch.heard}",
                      file=sys.stderr)
                continue
            if len(watch.heard) > 1 and kind in cut:
                cut[kind] += 1
            last, measured = watch.finished[-1], ""
            if isinstance(last, TurnFinished) and last.result.metrics.voice_to_voice_ms is not None:
                m = last.result.metrics
                latency.append(m.voice_to_voice_ms)
                early += m.early_reply
                measured = (f", {m.voice_to_voice_ms:.0f} ms (end of turn {m.end_of_turn_ms or 0:.0f}, "
                            f"STT {m.stt_ms or 0:.0f}, LLM first token {m.llm_ttft_ms or 0:.0f}, first clause "
                            f"{m.llm_first_clause_ms or 0:.0f}, TTFC {m.tts_ttfc_ms or 0:.0f}"
                            f"{', begun early' if m.early_reply else ''})")
            # each turn's figure as it comes: a run cut off by its time limit still tells what it measured
            print(f"{name}: turn {i} ({kind}){measured}: heard {watch.heard}", file=sys.stderr)
            if trace is not None:
                sound = last.result.metrics.voice_to_voice_ms if isinstance(last, TurnFinished) else None
                print(trace.timeline(began, sound), file=sys.stderr)
    return {"latency": latency, "cut": cut, "early": early}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where TTS, Whisper and the LLM run")
    parser.add_argument("--size", default="tiny", choices=["tiny", "0.6b"], help="the random speech model's size")
    parser.add_argument("--max-frames", type=int, default=8, help="the random speech model's frames a clause")
    parser.add_argument("--silence-ms", type=int, default=700, help="the fixed window")
    parser.add_argument("--longest-pause-ms", type=int, default=2000, help="with end-of-turn detection")
    parser.add_argument("--settle-s", type=float, default=2.5, help="idle listening that ends a turn's wait")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--turns", type=int, default=48, help="the first N turns of the script")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"which configurations, comma-separated, of: {', '.join(CONFIGS)}")
    parser.add_argument("--tail-ms", default=str(VadOptions.tail_ms),
                        help="VadOptions.tail_ms, or several, comma-separated: each configuration runs with each")
    parser.add_argument("--switch-ms", type=float,
                        help="the interpreter's switch interval while the loop runs (default: the loop's own, 1 ms)")
    parser.add_argument("--audio", default="pulse", choices=["pulse", "virtual"])
    parser.add_argument("--voices", help="folder of the lines' speech (default: a temporary one)")
    parser.add_argument("--voices-only", action="store_true", help="render the lines into --voices and stop")
    parser.add_argument("--whisper", help="a CTranslate2 Whisper folder (default: the bundled base)")
    parser.add_argument("--turn-model", help="the Smart Turn ONNX file (default: pipecat-ai's)")
    parser.add_argument("--json", help="also write each configuration's latencies and cut-offs to this JSON file")
    parser.add_argument("--trace", action="store_true",
                        help="print each turn's timeline: Whisper, the end-of-turn models, the LLM's tokens, clauses")
    args = parser.parse_args(argv)
    args.configs = args.configs.split(",")
    args.tail_ms = [int(t) for t in args.tail_ms.split(",")]
    if not set(args.configs) <= set(CONFIGS):
        parser.error(f"--configs takes {', '.join(CONFIGS)}")
    if args.voices_only and not args.voices:
        parser.error("--voices-only needs --voices")

    work = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    voices = Path(args.voices) if args.voices else work
    voices.mkdir(parents=True, exist_ok=True)
    if args.voices_only:
        for _, parts in script()[: args.turns]:
            utterance(parts, voices)
        print(f"{args.turns} turns' lines in {voices}", file=sys.stderr)
        return 0
    audio = Pulse() if args.audio == "pulse" else VirtualAudio()  # before sounddevice is imported
    try:
        return measure(args, audio, work, voices)
    finally:
        audio.stop()
        shutil.rmtree(work, ignore_errors=True)


def measure(args, audio, work: Path, voices: Path) -> int:
    from engine.audio import Microphone, Player
    from engine.dialogue import Dialogue
    from engine.history import HistoryStore
    from engine.llm.chat import ChatModel, ChatOptions, bundled_model_path
    from engine.stt.turn import TurnModel, default_threads
    from engine.stt.turn_text import TextTurnModel
    from engine.tts import load_tts

    turns = script()[: args.turns]
    trace = None
    if args.trace:
        from turn_trace import Trace

        trace = Trace()
        trace.install()
    tts = load_tts(random_checkpoint(work, args.size, args.max_frames), device=args.device)
    chat = ChatModel(bundled_model_path(), ChatOptions(n_ctx=2048, max_tokens=16, temperature=0.0, n_threads=1,
                                                       n_gpu_layers=None if args.device == "cuda" else 0))
    transcriber = load_transcriber(args)
    # the reader where the app puts it: on the GPU where the chat runs there
    model, reader = TurnModel(args.turn_model), TextTurnModel(threads=default_threads(), gpu_layers=chat.n_gpu_layers)
    results = {}
    with Player() as player, Microphone() as mic, HistoryStore(work / "history.sqlite3") as history:
        dialogue = Dialogue(chat, tts, player, history, transcriber)
        detection = f"end-of-turn detection (longest pause {args.longest_pause_ms} ms)"
        configs = {"fixed": (f"fixed {args.silence_ms} ms window", None, None, False, False),
                   "detection": (detection, model, reader, False, False),
                   "early": (f"{detection} + early reply", model, reader, True, False),
                   "voice": (f"{detection} of the voice alone + early reply", model, None, True, False),
                   "live": (f"{detection} + early reply + live transcript", model, reader, True, True)}
        for key in args.configs:
            for tail_ms in args.tail_ms:
                name, turn_model, text_model, early_reply, partials = configs[key]
                if len(args.tail_ms) > 1 or tail_ms != VadOptions.tail_ms:
                    name += f", tail {tail_ms} ms"
                results[name] = run_config(name, dialogue, mic, audio, turns, voices, args, turn_model, text_model,
                                           early_reply, partials, tail_ms, trace)

    paused = sum(kind in ("paused", "filler") for kind, _ in turns)
    tts_path = "megakernel" if tts.model.frame_kernel is not None else "PyTorch"
    print(f"\n{len(turns)} turns ({paused} with a pause for thought), --device {args.device}, --audio {args.audio}, "
          f"Whisper on {transcriber.device}, speech model {args.size} ({tts_path}), {model.path.name}\n")
    print("| configuration | response latency p50 ms | p95 ms | turns measured | replies begun early | "
          "false cut-offs |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        cut = sum(r["cut"].values())
        print(f"| {name} | {percentile(r['latency'], 50):.0f} | {percentile(r['latency'], 95):.0f} | "
              f"{len(r['latency'])} | {r['early']} | {cut} of {paused} ({100 * cut / max(paused, 1):.0f}%: "
              f"mid-sentence {r['cut']['paused']}, after a filler {r['cut']['filler']}) |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
