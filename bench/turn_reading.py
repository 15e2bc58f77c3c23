"""How the words' reader (engine/stt/turn_text.py) tells finished statements from Whisper's full stops on hanging
voices, on lines that are not bench/turn_taking.py's (whose turns chose the reader's thresholds).

Method: 40 sentences left hanging ("The meeting is on") and 30 finished statements ("The coffee is too hot."), each
spoken by espeak-ng in three voices, cut as the VAD cuts a pause (0-0.75 s of quiet before, 200 ms after) under a
faint hum, transcribed as a pause's early words are (Whisper base, CPU int8, the verbatim prompt, English) and judged
by engine/stt/turn.py judge_words. The windows whose words end a sentence are read (TextTurnModel.read): a hanging
one read as a statement ends its turn at VadOptions.statement_ms where its pause lasts that long; a statement read
as neither waits for sentence_ms, as it did without the reading.

    python bench/turn_reading.py [-v]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from whisper_window import hum, speak  # noqa: E402

from engine.stt import SAMPLE_RATE_HZ, Transcriber, TranscriberOptions  # noqa: E402
from engine.stt.turn import Meaning, Words, judge_words  # noqa: E402
from engine.stt.turn_text import TextTurnModel  # noqa: E402

HANGING = [
    "I'd like to order a", "Can you send a message to", "The meeting is on", "Set an alarm for", "I was thinking that",
    "Turn the volume up to", "What's the weather like in", "Yesterday I went to the", "Add eggs and",
    "My daughter's name is", "I need a recipe for", "The problem is that", "Could you look up the",
    "I'm trying to find a", "Send an email to my", "Play some music from the", "We should probably", "It's about",
    "The thing is", "Remind me in", "The name of the song is", "I forgot to", "Let's go to the", "Call my",
    "How long does it take to", "I bought a new", "My favourite food is", "The password is", "Tell me more about",
    "In the morning I usually", "The best way to", "I'm looking forward to", "So I was", "And then we", "Because",
    "Actually, I", "But the", "Well, I guess", "Maybe we could", "Do you know if the",
]
STATEMENTS = [
    "I just got home from work.", "The coffee is too hot.", "My phone battery is low.", "I can't find my keys.",
    "We had pizza for dinner.", "The kids are asleep now.", "It's really cold today.", "I passed my driving test.",
    "The dog needs a walk.", "My flight was cancelled.", "I love this song.", "The printer is out of paper.",
    "I'm feeling a bit tired.", "Our neighbours got a new car.", "The meeting went well.",
    "I lost my wallet yesterday.", "The sun is finally out.", "I started a new job.", "My tea is getting cold.",
    "The shop closes at five.", "I don't like mushrooms.", "She called me this morning.", "The baby is crying.",
    "I need a haircut.", "That was a great movie.", "The bus is late.", "My back hurts.", "We won the game.",
    "The oven is still on.", "I'm going to bed.",
]
VOICES = ("en-us", "en-gb", "en-us+f3")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("-v", "--verbose", action="store_true", help="each window's words and reading")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    transcriber = Transcriber(None, TranscriberOptions(device="cpu", cpu_threads=2))
    transcriber.warm_up()
    reader = TextTurnModel(threads=1)
    counts = {kind: Counter() for kind in ("hanging", "statement")}
    with tempfile.TemporaryDirectory() as folder:
        for kind, lines in (("hanging", HANGING), ("statement", STATEMENTS)):
            for text in lines:
                for voice in VOICES:
                    voiced = speak(text, voice, Path(folder))
                    before = np.zeros(int(rng.uniform(0, 0.75) * SAMPLE_RATE_HZ), np.float32)
                    audio = np.concatenate([before, voiced, np.zeros(int(0.2 * SAMPLE_RATE_HZ), np.float32)])
                    transcriber.heard_language = "en"
                    said = transcriber.transcribe(audio + hum(len(audio), rng), quick=True).text
                    words = judge_words(said, "en")
                    meaning = reader.read(said, "en") if words is Words.SENTENCE else None
                    counts[kind].update(["windows", words.name, *([meaning.name] if meaning else [])])
                    if args.verbose:
                        reading = reader.reading(said)
                        print(f"{kind:9} {voice:9} {words.name:8} {meaning.name if meaning else '-':9} whole "
                              f"{reading.whole:.3f} sentence {reading.sentence:.3f} | {text} -> {said}", flush=True)
    print("\nWhisper base, CPU int8; the bundled SmolLM2-135M reader; thresholds: whole "
          f"{reader.threshold}, sentence {reader.sentence_threshold}\n")
    print("| lines | windows | words end a sentence | ... read as a whole message | ... as a statement "
          "| ... as neither |")
    print("|---|---|---|---|---|---|")
    for kind, c in counts.items():
        print(f"| {kind} | {c['windows']} | {c[Words.SENTENCE.name]} | {c[Meaning.WHOLE.name]} "
              f"| {c[Meaning.STATEMENT.name]} | {c[Meaning.PART.name]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
