"""The `parley` command line: `parley say` speaks text to a WAV file and prints TTFC and RTF."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from engine.errors import ParleyError


def _say(args) -> int:
    import numpy as np
    import soundfile

    from engine.models import find_tts_model
    from engine.tts import load_tts

    out = Path(args.out)
    # checked before stdin is read or a model loaded: the temporary file goes beside the target
    if out.is_dir() or not out.parent.is_dir():
        problem = "it is a folder" if out.is_dir() else f"the folder {out.parent} does not exist"
        raise ParleyError(f"cannot write {out}: {problem}; choose another --out")
    text = sys.stdin.read() if args.text in (None, "-") else args.text
    t0 = time.perf_counter()
    tts = load_tts(find_tts_model(args.model), device=args.device, dtype=args.dtype)
    print(f"loaded {tts.folder} on {tts.device} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    speaker = args.speaker or (tts.speakers[0] if tts.speakers else None)
    stream = tts.stream(text, speaker, args.language, instruct=args.instruct, seed=args.seed)
    # audio goes to a temporary file beside the target, renamed only once complete
    fd, tmp = tempfile.mkstemp(suffix=".wav", prefix=f".{out.name}.", dir=out.parent if str(out.parent) else ".")
    os.close(fd)
    try:
        samples, ttfc = 0, None
        with soundfile.SoundFile(tmp, "w", samplerate=tts.sample_rate_hz, channels=1, subtype="PCM_16") as wav:
            for chunk in stream:
                if ttfc is None:
                    ttfc = chunk.t_ready - stream.t_start
                wav.write(np.clip(chunk.pcm, -1.0, 1.0))
                samples += chunk.pcm.size
        elapsed = time.perf_counter() - stream.t_start
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    seconds = samples / tts.sample_rate_hz
    rtf = elapsed / seconds if seconds else float("inf")
    print(f"{out}: {seconds:.2f} s of speech by {speaker} (seed {stream.seed}); "
          f"TTFC {1000 * (ttfc or 0):.0f} ms, RTF {rtf:.3f}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="parley", description="Parley: a private, offline voice assistant.")
    commands = parser.add_subparsers(dest="command", required=True)
    say = commands.add_parser("say", help="speak text into a WAV file")
    say.add_argument("text", nargs="?", help="what to say; '-' or nothing reads standard input")
    say.add_argument("--out", required=True, help="the WAV file to write (24 kHz mono)")
    say.add_argument("--model", help="checkpoint folder or hub id (default: Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice)")
    say.add_argument("--speaker", help="voice name (default: the model's first)")
    say.add_argument("--language", default="auto", help="language name or 'auto'")
    say.add_argument("--instruct", help="speaking style (1.7B) or voice description (VoiceDesign)")
    say.add_argument("--seed", type=int, help="makes the speech reproducible")
    say.add_argument("--device", default="cpu", help="cpu or cuda")
    say.add_argument("--dtype", help="float32, bfloat16 or float16 (default: float32 on CPU, bfloat16 on GPU)")
    args = parser.parse_args(argv)
    try:
        return {"say": _say}[args.command](args)
    except ParleyError as e:
        print(f"parley: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
