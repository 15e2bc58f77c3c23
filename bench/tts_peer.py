"""Parley's speech engine beside the peer faster-qwen3-tts (CUDA graphs) on one checkpoint: time to first audio and
real-time factor of one streamed utterance, each side in a process of its own (the peer needs transformers 5, the
engine its pinned 4.57), on the same GPU, one after the other.

Method: the same text and speaker, sampled (the checkpoint's defaults: temperature 0.9, top-k 50), as many frames as
the checkpoint's max_new_tokens allows (the peer's EOS held back to --frames; a random-weight checkpoint seldom ends by
itself, and bench/gpu_peer.sh writes one capped at --frames); one warm-up run, then --runs timed runs. TTFC: the call
-> the first audio in host memory. RTF: the call -> the last audio, over the audio's length.
The peer streams through FasterQwen3TTS.generate_custom_voice_streaming at each of --chunk-sizes (codec frames a
chunk); Parley through TTSEngine.stream (a first chunk of one frame, then four).

    python bench/tts_peer.py --side parley --folder CKPT --json parley.json   # Parley's environment
    python bench/tts_peer.py --side peer --folder CKPT --json peer.json       # faster-qwen3-tts 0.5.4's
    bash bench/gpu_peer.sh                                                    # both on the GPU machine, one call
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

TEXT = "Parley speaks this sentence as fast as it can, one frame of audio after another, for every listener."


def parley(folder: Path, runs: int) -> dict:
    from engine.tts import load_tts

    tts = load_tts(folder, device="cuda")
    speaker = tts.default_speaker

    def once() -> tuple[float, float, float]:
        stream = tts.stream(TEXT, speaker, "auto", seed=len(TEXT))
        chunks = list(stream)
        audio_s = sum(len(c.pcm) for c in chunks) / tts.sample_rate_hz
        return chunks[0].t_ready - stream.t_start, (chunks[-1].t_ready - stream.t_start) / audio_s, audio_s

    once()
    timed = [once() for _ in range(runs)]
    return {"parley": _figures(timed, f"megakernel {tts.model.frame_kernel is not None}, {speaker}")}


def peer(folder: Path, frames: int, runs: int, chunk_sizes: list[int]) -> dict:
    import torch
    from faster_qwen3_tts import FasterQwen3TTS

    model = FasterQwen3TTS.from_pretrained(str(folder), device="cuda", dtype=torch.bfloat16, local_files_only=True)
    speaker = model.model.get_supported_speakers()[0]
    languages = model.model.get_supported_languages() or ["auto"]
    language = "english" if "english" in languages else languages[0]

    def once(chunk_size: int) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        first, samples, rate = None, 0, None
        for audio, rate, _ in model.generate_custom_voice_streaming(
                TEXT, speaker, language, max_new_tokens=frames, min_new_tokens=frames, chunk_size=chunk_size):
            samples += len(audio)
            first = first or time.perf_counter() - t0
        return first, (time.perf_counter() - t0) / (samples / rate), samples / rate

    out = {}
    for chunk_size in chunk_sizes:
        once(chunk_size)
        out[f"faster-qwen3-tts, chunk_size {chunk_size}"] = _figures([once(chunk_size) for _ in range(runs)],
                                                                     f"{speaker}, {language}")
    return out


def _figures(timed: list[tuple[float, float, float]], detail: str) -> dict:
    ttfc, rtf, audio_s = (np.array(v) for v in zip(*timed))
    return {"ttfc_ms_p50": float(np.median(ttfc) * 1000), "ttfc_ms_p95": float(np.percentile(ttfc, 95) * 1000),
            "rtf_p50": float(np.median(rtf)), "audio_s": float(np.median(audio_s)), "runs": len(timed),
            "detail": detail}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", required=True, choices=["parley", "peer"])
    parser.add_argument("--folder", required=True, type=Path, help="the checkpoint (official layout)")
    parser.add_argument("--frames", type=int, default=250, help="the peer's frames an utterance (20 s)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--chunk-sizes", default="1,8", help="the peer's codec frames a chunk, comma-separated")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.side == "parley":
        figures = parley(args.folder, args.runs)
    else:
        figures = peer(args.folder, args.frames, args.runs, [int(c) for c in args.chunk_sizes.split(",")])
    for name, f in figures.items():
        print(f"| {name} | {f['ttfc_ms_p50']:.1f} | {f['ttfc_ms_p95']:.1f} | {f['rtf_p50']:.3f} | {f['audio_s']:.1f} "
              f"| {f['detail']} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
