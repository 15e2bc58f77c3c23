"""Replay of bench/turn_taking.py's 48 spoken turns through the end-of-turn policy alone, with the words of a pause
ready at once, as on a GPU (Whisper base takes milliseconds there): for each (turn_check_ms, sentence_ms,
statement_ms) asked, when the Endpointer decides each turn and which pauses for thought it cuts.

Method: each turn's speech (espeak-ng, as the benchmark's) with 2.5 s of silence after it, over the software
microphone's noise floor, is fed block by block to engine/stt/vad.py's Endpointer with Silero VAD, Smart Turn v3.2
and a words judge that transcribes the pause's audio there and then (engine/stt/turn.py judge_words; the transcript
of a pause is kept for every policy, as the audio is the same). Decision: the end of the turn's last speech block
-> the block whose arrival ends the turn, in the stream's own time. A turn that ends in its pause for thought is a
false cut-off. What this leaves out is the reply's work after the decision and the sound card, which
bench/turn_taking.py measures end to end (on a GPU some 100-140 ms).

Whisper runs on the CPU in int8, as the app there, or with --float32; with --device cuda on the GPU in float16, as
the app there, or in float32. They read some hanging voices differently, and a hanging voice read as a finished
sentence is what cuts a pause (bench/gpu_turn_policy.sh runs both on the GPU machine).

    python bench/turn_policy.py                                    # the defaults
    python bench/turn_policy.py --policies 200:600,150:600,200:400 --float32
    python bench/turn_policy.py --policies 200:600:600,200:600:400 --text-model with   # statements at 600, at 400
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from turn_taking import percentile, script, utterance  # noqa: E402
from virtual_audio import MIC_NOISE_RMS  # noqa: E402

from engine.stt import SAMPLE_RATE_HZ, SileroVad, Transcriber, TranscriberOptions, VadOptions  # noqa: E402
from engine.stt.turn import TurnModel, judge_words  # noqa: E402
from engine.stt.turn_text import TextTurnModel  # noqa: E402
from engine.stt.vad import Endpointer, Turn, split_blocks  # noqa: E402

TRAILING_SILENCE_S = 2.5  # longer than the longest pause the policies wait for


class Asked:
    """The end-of-turn model, keeping what it said about the turn being replayed (for --verbose)."""

    def __init__(self, model):
        self.model, self.said = model, []

    def probability(self, audio_16k: np.ndarray) -> float:
        self.said.append(self.model.probability(audio_16k))
        return self.said[-1]


def replay(audio: np.ndarray, options, vad, model, judge, read) -> list:
    """The Endpointer's Turn events for one turn's audio, each with the stream sample at which it was decided."""
    endpointer = Endpointer(options, vad=vad, turn_model=model, words=lambda key: judge(audio, key),
                            read=read and (lambda key: read(audio, key)))
    decided = []
    for i, block in enumerate(split_blocks(audio)):
        decided += [(turn, (i + 1) * len(block)) for turn in endpointer.feed(block) if isinstance(turn, Turn)]
    return decided


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = VadOptions()
    parser.add_argument("--policies", default=f"{default.turn_check_ms}:{default.sentence_ms}",
                        help="turn_check_ms:sentence_ms[:statement_ms], comma-separated (statement_ms: VadOptions', "
                             "or sentence_ms where it is larger)")
    parser.add_argument("--longest-pause-ms", type=int, default=2000, help="VadOptions.silence_ms")
    parser.add_argument("--tail-ms", type=int, default=VadOptions.tail_ms, help="VadOptions.tail_ms")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where Whisper runs")
    parser.add_argument("--float32", action="store_true",
                        help="Whisper in float32 instead of the CPU's int8 or the GPU's float16")
    parser.add_argument("--voices", help="folder of the lines' speech (default: a temporary one)")
    parser.add_argument("--whisper", help="a CTranslate2 Whisper folder (default: the bundled base)")
    parser.add_argument("--turn-model", help="the Smart Turn ONNX file (default: pipecat-ai's)")
    parser.add_argument("--text-model", default="with,without",
                        help="with, without or both (comma-separated): whether the words' meaning (engine/stt/"
                             "turn_text.py) may end a turn at the check")
    parser.add_argument("-v", "--verbose", action="store_true", help="each turn's decision and what was heard")
    args = parser.parse_args(argv)
    try:
        policies = [[int(v) for v in p.split(":")] for p in args.policies.split(",")]
        if any(len(p) not in (2, 3) for p in policies):
            raise ValueError
    except ValueError:
        parser.error(f"--policies takes turn_check_ms:sentence_ms[:statement_ms], got {args.policies!r}")
    policies = [(*p, min(default.statement_ms, p[1])) if len(p) == 2 else tuple(p) for p in policies]

    voices = Path(args.voices or tempfile.mkdtemp(prefix="parley-voices-"))
    voices.mkdir(parents=True, exist_ok=True)
    transcriber = Transcriber(args.whisper, TranscriberOptions(device=args.device, cpu_threads=2))
    if args.float32:  # the same model and prompt; only CTranslate2's arithmetic differs
        transcriber.compute_type = "float32"
        transcriber._model = transcriber._load()
    model, vad = Asked(TurnModel(args.turn_model)), SileroVad()
    heard = {}  # (turn, key) -> its Transcript, shared by the policies
    rng = np.random.default_rng(0)
    silence = np.zeros(round(TRAILING_SILENCE_S * SAMPLE_RATE_HZ), np.float32)
    turns = []
    for kind, parts in script():
        speech = np.concatenate([utterance(parts, voices), silence])
        turns.append((kind, speech + rng.normal(0, MIC_NOISE_RMS, len(speech)).astype(np.float32)))
    paused = sum(kind in ("paused", "filler") for kind, _ in turns)

    print(f"{len(turns)} turns, Whisper base on {transcriber.device} in {transcriber.compute_type}, "
          f"{model.model.path.name}, longest pause {args.longest_pause_ms} ms\n")
    texts = args.text_model.split(",")
    if not set(texts) <= {"with", "without"}:
        parser.error(f"--text-model takes with, without or both, got {args.text_model!r}")
    reader = TextTurnModel(gpu_layers=-1 if args.device == "cuda" else 0) if "with" in texts else None
    read = set()  # the (turn, key)s whose words the reader was asked about

    def judge(n, audio, key):
        if (n, key) not in heard:
            heard[n, key] = transcriber.transcribe(audio[key[0] : key[1]])
        return judge_words(heard[n, key].text, heard[n, key].language)

    def meaning(n, audio, key):
        read.add((n, key))
        transcript = heard[n, key]  # the words were judged first
        return reader.read(transcript.text, transcript.language)

    print("| turn_check_ms | sentence_ms | statement_ms | words' meaning | decision p50 ms | p95 ms "
          "| decided before sentence_ms | false cut-offs |")
    print("|---|---|---|---|---|---|---|---|")
    for (check_ms, sentence_ms, statement_ms), text in ((policy, text) for policy in policies for text in texts):
        options = VadOptions(silence_ms=args.longest_pause_ms, turn_check_ms=check_ms, sentence_ms=sentence_ms,
                             statement_ms=statement_ms, tail_ms=args.tail_ms)
        decisions, at_check, cut = [], 0, []
        for n, (kind, audio) in enumerate(turns):
            model.said.clear()
            ended = replay(audio, options, vad, model, lambda audio, key, n=n: judge(n, audio, key),
                           (lambda audio, key, n=n: meaning(n, audio, key)) if text == "with" else None)
            last, decided_at = ended[-1]
            last_speech = last.end_sample - options.tail_ms * SAMPLE_RATE_HZ // 1000
            decision_ms = (decided_at - last_speech) * 1000 / SAMPLE_RATE_HZ
            decisions.append(decision_ms)
            at_check += decision_ms < sentence_ms
            if len(ended) > 1:
                cut.append(n)
            if args.verbose:
                keys = [(t.start_sample, t.end_sample) for t, _ in ended]
                said = " | ".join(heard[n, key].text if (n, key) in heard else "?" for key in keys)
                meant = ", ".join("whole {:.3f} sentence {:.3f}".format(*reader.reading(heard[n, key].text))
                                  for key in keys if (n, key) in read)
                model_said = ", ".join(f"{p:.2f}" for p in model.said)
                print(f"  {check_ms}:{sentence_ms}:{statement_ms} {text} turn {n} ({kind}) {decision_ms:.0f} ms, "
                      f"{last.reason}, model {model_said}{', words ' + meant if meant else ''}: {said}")
        print(f"| {check_ms} | {sentence_ms} | {statement_ms} | {text} | {percentile(decisions, 50):.0f} | "
              f"{percentile(decisions, 95):.0f} | {at_check} of {len(turns)} | "
              f"{len(cut)} of {paused}{': turns ' + str(cut) if cut else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
