"""One long stream end to end: an hour of speech, or the whole of a long text, through the speech engine and the
codec in one TTSStream, with the process's memory along the way.

Method: the tiny random-weight checkpoint (or --model) on --device; the text is --text repeated to --chars
characters, spoken by one stream until it ends or --minutes of audio are out (0: to the end). Memory is the
process's resident set (VmRSS in /proc/self/status) after the first chunk, after each further --every minutes of
audio, and at the end, with the peak (VmHWM). Frames the stream's guard refused are counted from the engine's log.

    python bench/long_stream.py --minutes 60
    python bench/long_stream.py --text a --chars 20000 --minutes 0    # the whole text, however long it takes
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import load_tts  # noqa: E402
from engine.tts.testing import write_checkpoint  # noqa: E402

SENTENCES = ("The quick brown fox jumps over the lazy dog. Far away, a bell rang twice and the town woke up. "
             "Numbers like 42 and 3.14 are read aloud too. ")


def memory_mib() -> tuple[float, float]:
    """(resident, peak resident) of this process in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


class _Refusals(logging.Handler):
    """Counts the stream guard's warnings: a frame with a code outside the codec's range."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        self.count += "outside the codec's" in record.getMessage()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a checkpoint folder (default: the tiny random-weight one)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--text", default=SENTENCES, help="repeated to --chars characters")
    parser.add_argument("--chars", type=int, default=60_000)
    parser.add_argument("--minutes", type=float, default=60.0, help="stop after this much audio; 0: the whole text")
    parser.add_argument("--every", type=float, default=10.0, help="minutes of audio between memory readings")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench-ckpt")
    args = parser.parse_args()

    folder = args.model
    if folder is None:
        folder = args.cache / "tiny"
        if not (folder / "config.json").exists():
            write_checkpoint(folder, "tiny", seed=0)
    tts = load_tts(folder, device=args.device)
    text = (args.text * (args.chars // len(args.text) + 1))[:args.chars]
    refusals = _Refusals()
    logging.getLogger("engine.tts.stream").addHandler(refusals)

    stream = tts.stream(text, tts.speakers[0], seed=args.seed)
    rate, limit_s = tts.sample_rate_hz, args.minutes * 60
    samples = frames = 0
    readings = []  # (audio minutes, wall s, RSS MiB)
    next_reading_s = 0.0
    for chunk in stream:
        samples += chunk.pcm.size
        frames += chunk.codes.shape[0]
        audio_s = samples / rate
        if audio_s >= next_reading_s:
            readings.append((audio_s / 60, time.perf_counter() - stream.t_start, memory_mib()[0]))
            next_reading_s += args.every * 60
        if limit_s and audio_s >= limit_s:
            stream.cancel()
    wall_s = time.perf_counter() - stream.t_start
    rss, peak = memory_mib()
    if readings[-1][0] < samples / rate / 60:  # the last chunk was not a reading of its own
        readings.append((samples / rate / 60, wall_s, rss))

    print(f"| {tts.device}, {folder.name}, {len(text):,} characters in {stream.segments} parts, seed {args.seed} | |")
    print("|---|---|")
    for minutes, at_s, mib in readings:
        print(f"| RSS after {minutes:.1f} min of audio ({at_s:.0f} s) | {mib:.0f} MiB |")
    print(f"| RSS growth, first chunk to end | {rss - readings[0][2]:+.0f} MiB |\n| peak RSS | {peak:.0f} MiB |")
    print(f"| frames | {frames:,} |\n| audio | {samples / rate / 60:.1f} min |\n| wall time | {wall_s:.0f} s |")
    print(f"| RTF | {wall_s / (samples / rate):.3f} |\n| frames refused by the guard | {refusals.count} |")
    print(f"| parts spoken | {chunk.segment + 1} of {stream.segments} |")


if __name__ == "__main__":
    main()
