"""Echo cancellation on a real loopback: ERLE and delay of the candidate libraries (docs/BENCHMARKS.md).

A private PulseAudio server with a 48 kHz null sink whose monitor is the default source: Parley's
Player plays espeak-ng speech into it and a Microphone records it back, both through PortAudio, so
the recording is Parley's own voice as its microphone gets it. One run records; on it:

- live: engine/audio/echo.py's EchoCanceller (LiveKit's WebRTC AEC3) in the real hooks, as it runs
  in Parley (the Player's callback feeds the far end, the Microphone's callback is cleaned);
- offline, on the same raw recording and the same far-end alignment: the same canceller replayed,
  and pyaec (Speex's MDF echo canceller through aec-rs), where it is installed.

ERLE = 10 log10(echo power in / power out) over the 10 ms frames where Parley speaks, after the first
second of speech (the filters' convergence) and over all of it. The delay is where the raw recording
best matches the far end that EchoCanceller pairs with it (cross-correlation): the part of the echo
path the devices' latency reports do not account for, which the canceller must find by itself.

    .venv/bin/python bench/aec.py [--seconds 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LINES = [
    "Sure. The train to Lyon leaves at ten past nine from platform four, and it takes about two hours.",
    "I have set a timer for twelve minutes. Would you like me to remind you when the pasta is ready?",
    "The weather tomorrow looks dry in the morning, with some rain coming in after three o'clock.",
]


def start_pulse(folder: Path) -> dict:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(folder), "PULSE_RUNTIME_PATH": str(folder / "pulse")}
    env.pop("PULSE_SERVER", None)
    subprocess.run(["pulseaudio", "-n", "--daemonize=yes", "--exit-idle-time=-1", "--disallow-exit",
                    "-L", "module-null-sink sink_name=vsink rate=48000",
                    "-L", "module-native-protocol-unix auth-anonymous=1"],
                   env=env, check=True, capture_output=True, timeout=30)  # fmt: skip
    for args in (["set-default-sink", "vsink"], ["set-default-source", "vsink.monitor"]):
        subprocess.run(["pactl", *args], env=env, check=True, capture_output=True, timeout=10)
    os.environ.update({k: env[k] for k in ("XDG_RUNTIME_DIR", "PULSE_RUNTIME_PATH")})  # before PortAudio loads
    os.environ.pop("PULSE_SERVER", None)
    return env


def speech(folder: Path, seconds: float) -> np.ndarray:
    """espeak-ng lines with 0.6 s pauses, at 24 kHz (the Player's rate), about `seconds` long."""
    import soundfile
    import soxr

    parts = []
    while sum(map(len, parts)) < seconds * 24_000:
        wav = folder / f"{len(parts)}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(wav), LINES[len(parts) // 2 % len(LINES)]],
                       check=True)
        audio, rate = soundfile.read(wav, dtype="float32")
        parts += [soxr.resample(audio, rate, 24_000).astype(np.float32), np.zeros(int(0.6 * 24_000), np.float32)]
    return np.concatenate(parts)[: int(seconds * 24_000)]


class Recorder:
    """Stands between the devices and an EchoCanceller: keeps every far-end and near-end call in order."""

    def __init__(self, canceller):
        self.canceller, self.calls, self.cleaned = canceller, [], []

    def far_end(self, pcm, rate_hz, t_sound):
        self.calls.append(("far", np.array(pcm, np.float32), rate_hz, t_sound))
        self.canceller.far_end(pcm, rate_hz, t_sound)

    def near_end(self, pcm, t_recorded):
        self.calls.append(("near", np.array(pcm, np.float32), t_recorded))
        out = self.canceller.near_end(pcm, t_recorded)
        self.cleaned.append(out)
        return out


def replay(calls, canceller) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw near end, cleaned, the far end the canceller paired with each raw sample) from recorded calls."""
    raw, out, paired = [], [], []
    for call in calls:
        if call[0] == "far":
            canceller.far_end(*call[1:])
            continue
        pcm, t = call[1], call[2]
        cleaned = canceller.near_end(pcm, t)
        out.append(cleaned)
        paired.append(canceller.reference(len(cleaned)))
        raw.append(pcm)
    n = sum(map(len, out))
    near = np.concatenate(raw)[:n]
    return near, np.concatenate(out), np.concatenate(paired)[: n] if paired else np.zeros(n, np.float32)


def erle_db(near: np.ndarray, out: np.ndarray, far: np.ndarray, skip_s: float) -> float:
    frames = len(out) // echo_frame() * echo_frame()
    shape = (-1, echo_frame())
    n, o, f = (x[:frames].reshape(shape).astype(np.float64) for x in (near, out, far))
    active = np.sqrt(np.mean(f**2, axis=1)) > 10 ** (-50 / 20)
    first = np.argmax(active) if active.any() else 0
    keep = active & (np.arange(len(active)) >= first + int(skip_s * 100))
    return float(10 * np.log10(np.sum(n[keep] ** 2) / max(np.sum(o[keep] ** 2), 1e-20)))


def echo_frame() -> int:
    from engine.audio.echo import FRAME_SAMPLES

    return FRAME_SAMPLES


def delay_ms(near: np.ndarray, far: np.ndarray) -> float:
    """How far the echo in `near` lags the far end paired with it (cross-correlation over +-200 ms);
    AEC3 needs it positive, and the pairing's LEAD_S is part of it."""
    span = 3200
    n = len(near) - 2 * span
    scores = [float(np.dot(near[span + k : span + k + n], far[span : span + n])) for k in range(-span, span)]
    return (int(np.argmax(scores)) - span) / 16.0


def pyaec_offline(near: np.ndarray, far: np.ndarray) -> np.ndarray | None:
    try:
        from pyaec import Aec
    except ImportError:
        return None
    frame = echo_frame()
    aec = Aec(frame, 16 * 200, 16_000, False)  # a 200 ms filter, no Speex preprocessor (AEC only)
    out = np.zeros_like(near)
    to16 = lambda x: (np.clip(x, -1, 32767 / 32768) * 32768).astype(np.int16).tolist()  # noqa: E731
    for start in range(0, len(near) // frame * frame, frame):
        got = aec.cancel_echo(to16(near[start : start + frame]), to16(far[start : start + frame]))
        out[start : start + frame] = np.asarray(got, np.float32) / 32768
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=12.0, help="speech played (default 12)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    for tool in ("pulseaudio", "pactl", "espeak-ng"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed")

    folder = Path(tempfile.mkdtemp(prefix="parley-aec-"))
    folder.chmod(0o700)
    env = start_pulse(folder)
    try:
        from engine.audio.echo import LEAD_S, EchoCanceller
        from engine.audio.microphone import Microphone
        from engine.audio.player import Player

        audio = speech(folder, args.seconds)
        recorder = Recorder(EchoCanceller())
        with Player() as player, Microphone() as mic:
            player.echo, mic.echo = recorder, recorder
            time.sleep(1.0)  # both streams running before Parley speaks
            player.write(audio)
            player.wait_done(args.seconds + 10)
            time.sleep(0.5)  # the last echo recorded
            player.echo = mic.echo = None
        live = np.concatenate(recorder.cleaned)
        t0 = time.perf_counter()
        near, again, far = replay(recorder.calls, EchoCanceller())
        cpu_ms = (time.perf_counter() - t0) * 1000 / (len(near) / 16_000)
        live = live[: len(near)]
        results = {
            "machine": os.uname().nodename,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "seconds": args.seconds,
            "player_rate_hz": player.rate_hz,
            "mic_rate_hz": mic.rate_hz,
            "echo_lag_ms": round(delay_ms(near, far), 1),
            "lead_ms": LEAD_S * 1000,
            "livekit_live_erle_db": round(erle_db(near, live, far, 1.0), 1),
            "livekit_live_erle_all_db": round(erle_db(near, live, far, 0.0), 1),
            "livekit_replay_erle_db": round(erle_db(near, again, far, 1.0), 1),
            "livekit_replay_cpu_ms_per_s": round(cpu_ms, 1),
        }
        mdf = pyaec_offline(near, far)
        if mdf is not None:
            results["pyaec_erle_db"] = round(erle_db(near, mdf, far, 1.0), 1)
            results["pyaec_erle_all_db"] = round(erle_db(near, mdf, far, 0.0), 1)
        print(json.dumps(results, indent=2))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        subprocess.run(["pulseaudio", "--kill"], env=env, capture_output=True, timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
