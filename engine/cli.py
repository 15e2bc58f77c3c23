"""The `parley` command line: `parley say` speaks text on the speakers (or into a WAV file) and prints
TTFC and RTF; `parley chat` holds a spoken conversation through the microphone (engine/voice.py), or
with --text a typed one; each reply is printed and spoken, its figures on stderr."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

from engine.errors import ParleyError


def _speaker(folder: Path, speaker: str | None, language: str, instruct: str | None) -> str | None:
    """The speaker to use (the model's first where none is named), the voice checked against the model's config.json
    before its weights load: a misspelt name is told at once, not after a load or a first GPU use's compile. A
    config.json that cannot be read is left to load_tts, which names the fault and how to get the model again."""
    from engine.errors import ModelFilesError
    from engine.tts.config import TTSConfig
    from engine.tts.prompt import resolve_voice

    try:
        config = TTSConfig.from_file(folder / "config.json")
    except ModelFilesError:
        return speaker
    speaker = speaker or config.default_speaker
    resolve_voice(config, speaker, language, instruct)
    return speaker


def _load_tts(folder: Path, device: str, dtype: str | None = None):
    """load_tts on a model folder, saying first when it compiles the GPU kernel: a first use of a kernel version
    spends about a minute there, which would otherwise look like a hang."""
    from engine.tts import load_tts

    if device.startswith("cuda"):
        from engine.tts.megakernel import needs_build

        if needs_build():
            print("parley: compiling the GPU kernel (first use of this version, about a minute)", file=sys.stderr,
                  flush=True)
    return load_tts(folder, device=device, dtype=dtype)


def _say(args) -> int:
    from engine.models import find_tts_model
    from engine.text import clean_text, speech_seconds

    out = Path(args.out) if args.out else None
    # checked before stdin is read or a model loaded: the temporary file goes beside the target
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        problem = "it is a folder" if out.is_dir() else f"the folder {out.parent} does not exist"
        raise ParleyError(f"cannot write {out}: {problem}; choose another --out")
    text = sys.stdin.read() if args.text in (None, "-") else args.text
    cleaned = clean_text(text)  # nothing to speak is said before a model loads (a first GPU use compiles a minute)
    folder = find_tts_model(args.model)
    speaker = _speaker(folder, args.speaker, args.language, args.instruct)
    t0 = time.perf_counter()
    tts = _load_tts(folder, args.device, args.dtype)
    print(f"loaded {tts.folder} on {tts.device} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    stream = tts.stream(text, speaker, args.language, instruct=args.instruct, seed=args.seed)
    progress = _Progress(stream, tts.sample_rate_hz)
    if stream.segments > 1:
        keeps = f" and keeps what is written in {out}" if out else ""
        print(f"parley: {len(cleaned):,} characters in {stream.segments} parts, about "
              f"{_duration(speech_seconds(cleaned))} of speech; Ctrl-C stops{keeps}", file=sys.stderr, flush=True)
    try:
        elapsed, where = _write_wav(stream, tts, out, progress) if out else _play(stream, args.output_device, progress)
    except KeyboardInterrupt:
        progress.end()
        kept = f"; kept {_duration(progress.seconds)} of speech in {out}" if out and progress.seconds else ""
        print(f"parley: stopped{kept}", file=sys.stderr)
        return 130
    progress.end()
    seconds = progress.seconds
    rtf = elapsed / seconds if seconds else float("inf")
    print(f"{where}: {seconds:.2f} s of speech by {speaker} (seed {stream.seed}); "
          f"TTFC {1000 * (progress.ttfc_s or 0):.0f} ms, RTF {rtf:.3f}", file=sys.stderr)
    return 0


def _duration(seconds: float) -> str:
    """'12 s', '3:05' or '1:02:09'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class _Progress:
    """How much speech a stream has made (and its TTFC), told while a text of several parts is spoken: a line
    rewritten in place on a terminal (at most a few times a second), a line for each finished part elsewhere (a log)."""

    def __init__(self, stream, sample_rate_hz: int):
        self.stream, self.parts, self.rate_hz = stream, stream.segments, sample_rate_hz
        self.samples, self.part = 0, 0
        self.ttfc_s: float | None = None
        self.terminal = sys.stderr.isatty()
        self._shown_at = 0.0

    @property
    def seconds(self) -> float:
        return self.samples / self.rate_hz

    def add(self, chunk) -> None:
        if self.ttfc_s is None:
            self.ttfc_s = chunk.t_ready - self.stream.t_start
        if self.parts > 1 and not self.terminal and chunk.segment != self.part:
            self._line(f"parley: part {self.part + 1} of {self.parts} done, {_duration(self.seconds)} of speech\n")
        self.samples += chunk.pcm.size
        self.part = chunk.segment
        now = time.monotonic()
        if self.parts > 1 and self.terminal and now - self._shown_at >= 0.25:
            self._shown_at = now
            self._line(f"\rparley: part {self.part + 1} of {self.parts}, {_duration(self.seconds)} of speech\x1b[K")

    def end(self) -> None:
        """Clears the terminal's progress line, so the next message starts on a clean line."""
        if self.parts > 1 and self.terminal:
            self._line("\r\x1b[K")

    @staticmethod
    def _line(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()


def _write_wav(stream, tts, out: Path, progress: _Progress):
    """Stream into a temporary file beside `out`, renamed once complete: (elapsed_s, out).

    Ctrl-C keeps what was written: the file is closed (a valid WAV of the speech so far) and renamed to `out`.
    """
    import numpy as np
    import soundfile

    fd, tmp = tempfile.mkstemp(suffix=".wav", prefix=f".{out.name}.", dir=out.parent if str(out.parent) else ".")
    os.close(fd)
    try:
        with soundfile.SoundFile(tmp, "w", samplerate=tts.sample_rate_hz, channels=1, subtype="PCM_16") as wav:
            for chunk in stream:
                wav.write(np.clip(chunk.pcm, -1.0, 1.0))
                progress.add(chunk)
        elapsed = time.perf_counter() - stream.t_start
        os.replace(tmp, out)
    except KeyboardInterrupt:
        if progress.samples:  # leaving the `with` closed the file: a valid WAV of the speech so far
            os.replace(tmp, out)
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return elapsed, out


def _play(stream, device, progress: _Progress):
    """Speak each chunk as it arrives, then wait for the device to play it all: (elapsed_s, where)."""
    from engine.audio import Player

    with Player(device) as player:
        for chunk in stream:
            player.write(chunk.pcm)
            progress.add(chunk)
        elapsed = time.perf_counter() - stream.t_start
        # a generous bound: the speech itself, plus the sound server's start-up
        if not player.wait_done(timeout_s=30 + 2 * progress.seconds):
            raise ParleyError(f"output device {player.device.name} stopped playing; choose another with --output-device")
        return elapsed, f"played on {player.device.name}"


def _chat(args) -> int:
    from engine.audio import Player
    from engine.history import HistoryStore, history_path
    from engine.llm.chat import ChatModel, bundled_model_path
    from engine.models import find_tts_model
    from engine.pipeline import Dialogue, DialogueOptions

    llm_path = Path(args.llm) if args.llm else bundled_model_path()  # says how to install it when missing
    folder = find_tts_model(args.model)
    speaker = _speaker(folder, args.speaker, DialogueOptions.language, None)
    chat = ChatModel(llm_path)
    tts = _load_tts(folder, args.device)
    transcriber = None
    if not args.text:
        from engine.stt import Transcriber

        transcriber = Transcriber(args.whisper)
        transcriber.warm_up()  # the first turn should not pay for the model's first run
    # a history held by another program or read-only does not stop the conversation: turns wait for it
    with Player(args.output_device) as player, HistoryStore(history_path(args.profile), open_later=True) as history:
        if history.open_error is not None:
            print(f"parley: {history.open_error}", file=sys.stderr)
        dialogue = Dialogue(chat, tts, player, history, transcriber, options=DialogueOptions(speaker=speaker))
        about = f"parley: {llm_path.name} and {tts.folder.name}, voice {dialogue.speaker}"
        try:
            return _typed_chat(dialogue, about) if args.text else _voice_chat(dialogue, args, about)
        finally:
            if dialogue.unsaved:
                n = len(dialogue.unsaved)
                print(f"parley: {n} turn{'s' if n != 1 else ''} could not be saved: {history.path} could not be "
                      "written", file=sys.stderr)


def _figures(metrics) -> str:
    from engine.metrics import FIGURES

    figures = metrics.as_dict()
    return "  [" + ", ".join(f"{name} {figures[name]:.3g}" for name in FIGURES if name in figures) + "]"


def _typed_chat(dialogue, about: str) -> int:
    # the reply is printed as a whole once spoken, so stderr's figures follow the text they belong to
    print(f"{about}; type a message, an empty line or Ctrl-D ends", file=sys.stderr)
    for line in sys.stdin:
        text = line.strip()
        if not text:
            break
        _reopen_speakers(dialogue.player)
        try:
            result = dialogue.text_turn(text)
        except ParleyError as e:  # one failed turn does not end the conversation
            print(f"parley: {e}", file=sys.stderr)
            continue
        print(result.reply_text, flush=True)
        print(_figures(result.metrics), file=sys.stderr, flush=True)
    return 0


def _reopen_speakers(player) -> None:
    """Lost speakers are tried again before each typed turn (the voice loop does it by itself)."""
    from engine.errors import AudioDeviceError

    if player.lost is None:
        return
    try:
        player.reopen()
    except AudioDeviceError as e:
        print(f"parley: {e}", file=sys.stderr, flush=True)
    else:
        print(f"parley: the speakers are back: output device {player.device.name!r}", file=sys.stderr, flush=True)


def _voice_chat(dialogue, args, about: str) -> int:
    """The microphone conversation until Ctrl-C; push-to-talk: Enter starts and ends each turn, Ctrl-D quits."""
    from engine.audio import Microphone
    from engine.errors import MicrophoneAccessError
    from engine.stt.vad import Mode, VadOptions
    from engine.voice import (BargeIn, DeviceLost, DeviceRestored, Heard, TurnFailed, TurnFinished, VoiceLoop,
                              VoiceOptions)

    def show(event):
        if isinstance(event, Heard):
            print(f"you: {event.text}", flush=True)
        elif isinstance(event, TurnFinished):
            print(f"parley: {event.result.reply_text}", flush=True)
            print(_figures(event.result.metrics), file=sys.stderr, flush=True)
        elif isinstance(event, (TurnFailed, DeviceLost, DeviceRestored)):
            print(f"parley: {event.message}", file=sys.stderr, flush=True)
        elif isinstance(event, BargeIn):
            print("  [interrupted]", file=sys.stderr, flush=True)

    mode = Mode.PUSH_TO_TALK if args.push_to_talk else Mode.HANDS_FREE
    options = VoiceOptions(mode=mode, vad=VadOptions(silence_ms=args.silence_ms))
    try:
        mic = Microphone(args.input_device)
    except MicrophoneAccessError as e:  # the conversation goes on, typed
        print(f"parley: {e}", file=sys.stderr, flush=True)
        return _typed_chat(dialogue, about)
    with mic, VoiceLoop(dialogue, mic, options=options) as loop:
        loop.subscribe(show)
        loop.start()
        how = ("press Enter to talk and Enter again when done; Ctrl-D quits" if args.push_to_talk
               else "speak when you like (typed lines are turns too); Ctrl-C quits")
        print(f"{about}; hearing {mic.device.name}, speaking on {dialogue.player.device.name}; {how}",
              file=sys.stderr, flush=True)
        try:
            talking = False
            for line in sys.stdin:
                if args.push_to_talk:
                    talking = not talking
                    if talking:
                        loop.press()
                    else:
                        loop.release()
                    print("  [talking: press Enter when done]" if talking else "  [thinking]", file=sys.stderr,
                          flush=True)
                elif line.strip():
                    loop.submit_text(line.strip())
            if not args.push_to_talk:  # no more typing (stdin closed, or none): keep listening
                threading.Event().wait()
        except KeyboardInterrupt:
            print("", file=sys.stderr)
    return 0


def _device(value: str) -> str:
    """--device's type: cpu, cuda or cuda:N (argparse's usage error otherwise, not a traceback from the engine)."""
    if re.fullmatch(r"cpu|cuda(:\d+)?", value) is None:
        raise argparse.ArgumentTypeError(f"'{value}' is not a device; choose cpu, cuda or cuda:N")
    return value


def _milliseconds(value: str) -> int:
    """--silence-ms's type: a whole number >= 0, checked before the models load."""
    if not value.isdecimal():
        raise argparse.ArgumentTypeError(f"'{value}' is not a whole number of milliseconds >= 0")
    return int(value)


def _show_warnings() -> None:
    """Engine warnings (no GPU or no room on it, so the CPU is used) go to stderr as 'parley: warning: ...'.

    Unconfigured, Python prints them only through its last-resort handler, which a library setting up
    the root logger silences; so the engine's logger gets a handler of its own (once per process).
    """
    engine_log = logging.getLogger("engine")
    if not engine_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("parley: warning: %(message)s"))
        handler.setLevel(logging.WARNING)
        engine_log.addHandler(handler)


def main(argv=None) -> int:
    _show_warnings()
    parser = argparse.ArgumentParser(prog="parley", description="Parley: a private, offline voice assistant.")
    commands = parser.add_subparsers(dest="command", required=True)
    say = commands.add_parser("say", help="speak text on the speakers, or into a WAV file")
    say.add_argument("text", nargs="?", help="what to say; '-' or nothing reads standard input")
    say.add_argument("--out", help="write a WAV file (24 kHz mono) instead of playing")
    say.add_argument("--output-device", help="speaker to play on: a name, part of one, or an index (default: the system's)")
    say.add_argument("--model", help="checkpoint folder or hub id (default: Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice)")
    say.add_argument("--speaker", help="voice name (default: the model's first)")
    say.add_argument("--language", default="auto", help="language name or 'auto'")
    say.add_argument("--instruct", help="speaking style (1.7B) or voice description (VoiceDesign)")
    say.add_argument("--seed", type=int, help="makes the speech reproducible")
    say.add_argument("--device", default="cpu", type=_device, help="cpu or cuda (cuda:N: the Nth GPU)")
    say.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                     help="default: float32 on CPU, bfloat16 on GPU")
    chat = commands.add_parser("chat", help="talk with Parley through the microphone: replies are printed and spoken")
    chat.add_argument("--text", action="store_true", help="type your turns on standard input (one a line) instead")
    chat.add_argument("--push-to-talk", action="store_true", help="Enter starts and ends each spoken turn "
                      "(default: hands-free, a pause ends the turn)")
    chat.add_argument("--silence-ms", type=_milliseconds, default=700, help="hands-free: the pause that ends a turn (ms)")
    chat.add_argument("--input-device", help="microphone: a name, part of one, or an index (default: the system's)")
    chat.add_argument("--output-device", help="speaker: a name, part of one, or an index (default: the system's)")
    chat.add_argument("--whisper", help="Whisper model: a CTranslate2 folder or hub name (default: the bundled base)")
    chat.add_argument("--model", help="TTS checkpoint folder or hub id (default: Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice)")
    chat.add_argument("--llm", help="GGUF chat model file (default: the bundled SmolLM2-135M-Instruct)")
    chat.add_argument("--speaker", help="voice name (default: the TTS model's first)")
    chat.add_argument("--device", default="cpu", type=_device, help="cpu or cuda (cuda:N: the Nth GPU), for the TTS")
    chat.add_argument("--profile", default="default", help="whose history the turns are saved in")
    args = parser.parse_args(argv)
    try:
        return {"say": _say, "chat": _chat}[args.command](args)
    except ParleyError as e:
        print(f"parley: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
