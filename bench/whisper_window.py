"""How Whisper base reads a turn when its encoder window is cut short of 30 s: word error rate, the end of turn read
from the words (engine/stt/turn.py judge_words), repeats, and text made up from a hum, against the full window.

Method: espeak-ng lines (bench/turn_taking.py's 12 statements and 12 questions, the first parts of its 12 paused and 12
filler turns, five 4-7 s sentences, six one-word answers, two German lines) are each cut --windows times as the VAD
cuts a turn (0-0.75 s of quiet before the voice, 0.06-0.3 s after it) under a 50 Hz hum of random phase at -72..-66
dBFS, plus hum alone (0.3-4 s, twice each). Each window is transcribed quickly (in the line's language, with the
verbatim prompt) by engine/stt/whisper.py's Transcriber once for each --frames: the encoder reads that many feature
frames where only padding follows them, else all 3000 (faster-whisper's window). Printed per window size: the mean word
error rate (a looping transcript counts its extra words), texts and judge_words equal to the full window's, hanging
lines read as trailing, whole lines read as a finished sentence, transcripts over 1.5x the line's words (+2), hum
turned into text, and the encoder's median time (2 CPU threads).

    python bench/whisper_window.py --frames 3000 2500 2000 1000 --windows 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from turn_taking import FILLERS, PAUSED, QUESTIONS, STATEMENTS  # noqa: E402
from voice_loop import speech  # noqa: E402

from engine.stt import SAMPLE_RATE_HZ, Transcriber, TranscriberOptions  # noqa: E402
from engine.stt.turn import Words, judge_words  # noqa: E402
from tests.stt.conftest import word_error_rate  # noqa: E402

LONG = [
    "The quick brown fox jumps over the lazy dog. Please turn on the kitchen lights. What time is it in London?",
    "Tell me about the weather today and what I should wear tomorrow morning.",
    "I would like to book a flight to Berlin for next Tuesday, and make sure it leaves after ten in the morning.",
    "Remind me to call my mother on Sunday afternoon, and add milk, eggs and bread to the shopping list.",
    "Yesterday we walked along the river for two hours, then we had lunch in a small cafe near the old bridge.",
]
SHORT = ["Yes.", "No.", "Okay.", "Stop.", "Thanks.", "Hello."]
GERMAN = ["Guten Morgen, wie geht es dir?", "Guten Morgen, wie geht es dir heute?"]
HANGING = ("paused", "filler")  # the first parts of turns with a pause: the words stop mid-sentence


def lines() -> list[tuple[str, str, str]]:
    """(text, espeak-ng voice, kind) of every line."""
    return ([(t, "en-us", "statement") for t in STATEMENTS] + [(t, "en-us", "question") for t in QUESTIONS]
            + [(p[0], "en-us", "paused") for p in PAUSED] + [(f[0], "en-us", "filler") for f in FILLERS]
            + [(t, "en-us", "long") for t in LONG] + [(t, "en-us", "short") for t in SHORT]
            + [(t, "de", "german") for t in GERMAN])


def speak(text: str, voice: str, folder: Path) -> np.ndarray:
    """bench/voice_loop.py's espeak-ng line, cut to its voiced samples."""
    audio = speech(text, folder, voice)
    lo, hi = np.flatnonzero(np.abs(audio) > 0.01)[[0, -1]]
    return audio[lo:hi + 1]


def hum(samples: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(samples) / SAMPLE_RATE_HZ
    level = 10 ** (rng.uniform(-72, -66) / 20) * np.sqrt(2)
    return (level * np.sin(2 * np.pi * 50 * t + rng.uniform(0, 2 * np.pi))).astype(np.float32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[3000, 2500, 2000, 1000],
                        help="encoder windows to compare, in 10 ms frames; 3000 (30 s) is the reference")
    parser.add_argument("--windows", type=int, default=3, help="cuts of each line")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--whisper", help="a CTranslate2 Whisper folder (default: the bundled base)")
    args = parser.parse_args()
    sizes = [3000] + [f for f in args.frames if f != 3000]

    transcriber = Transcriber(args.whisper, TranscriberOptions(device="cpu", cpu_threads=2))
    transcriber.warm_up()
    encoder = transcriber._model.encode  # engine/stt/whisper.py _EncodedOnce, over WhisperModel.encode
    encode, encode_s, frames = encoder._encode, [], [3000]

    def cut(features):  # (80, 3000): faster-whisper pads with zeros (pad_or_trim); only those are cut
        if not features[:, frames[0]:].any():
            features = features[:, : frames[0]]
        t0 = time.perf_counter()
        encoded = encode(features)
        encode_s.append(time.perf_counter() - t0)
        return encoded

    encoder._encode = cut
    rng = np.random.default_rng(args.seed)
    turns = []  # (text, kind, language, audio)
    with tempfile.TemporaryDirectory() as folder:
        for text, voice, kind in lines():
            voiced = speak(text, voice, Path(folder))
            for _ in range(args.windows):
                before = np.zeros(int(rng.uniform(0, 0.75) * SAMPLE_RATE_HZ), np.float32)
                after = np.zeros(int(rng.uniform(0.06, 0.3) * SAMPLE_RATE_HZ), np.float32)
                audio = np.concatenate([before, voiced, after])
                turns.append((text, kind, "de" if voice == "de" else "en", audio + hum(len(audio), rng)))
    for seconds in (0.3, 0.6, 1.0, 2.0, 4.0):
        turns += [("", "hum", "en", hum(int(seconds * SAMPLE_RATE_HZ), rng)) for _ in range(2)]

    heard = {size: [] for size in sizes}  # per size, per turn: (text, Words)
    times = {size: [] for size in sizes}
    for i, (text, kind, language, audio) in enumerate(turns):
        for size in sizes:
            frames[0], encoder._last = size, None
            transcriber.heard_language = language
            encode_s.clear()
            said = transcriber.transcribe(audio, quick=True).text
            heard[size].append((said, judge_words(said, language)))
            times[size] += encode_s
        print(f"{i + 1}/{len(turns)} {text!r}: " + " | ".join(f"{s}: {heard[s][-1][0][:60]!r}" for s in sizes),
              file=sys.stderr, flush=True)

    spoken = [i for i, turn in enumerate(turns) if turn[0]]
    hanging = [i for i, turn in enumerate(turns) if turn[1] in HANGING]
    whole = [i for i in spoken if i not in hanging]
    noise = [i for i, turn in enumerate(turns) if not turn[0]]
    print(f"\nWhisper base, CPU int8, 2 threads; {len(spoken)} spoken windows ({len(hanging)} hanging), "
          f"{len(noise)} of hum alone\n")
    print("| encoder frames | encoder p50 ms | WER | same text | same judge_words | hanging read TRAILING "
          "| whole read SENTENCE | repeats | hum made text |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        said = heard[size]
        wer = statistics.mean(word_error_rate(turns[i][0], said[i][0]) for i in spoken)
        same = sum(said[i][0] == heard[3000][i][0] for i in spoken)
        agree = sum(said[i][1] is heard[3000][i][1] for i in spoken)
        trailing = sum(said[i][1] is Words.TRAILING for i in hanging)
        sentence = sum(said[i][1] is Words.SENTENCE for i in whole)
        repeats = sum(len(said[i][0].split()) > 1.5 * len(turns[i][0].split()) + 2 for i in spoken)
        made_up = sum(bool(said[i][0]) for i in noise)
        print(f"| {size} | {statistics.median(times[size]) * 1000:.0f} | {wer:.3f} | {same}/{len(spoken)} "
              f"| {agree}/{len(spoken)} | {trailing}/{len(hanging)} | {sentence}/{len(whole)} | {repeats} "
              f"| {made_up}/{len(noise)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
