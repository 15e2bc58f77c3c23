"""The `parley` command line: `parley say` speaks text on the speakers (or into a WAV file) and prints
TTFC and RTF; `parley chat` holds a spoken conversation through the microphone (engine/assistant.py), or
with --text a typed one; each reply is printed and spoken, its figures on stderr. Both take the models and
the voice chosen in the app (engine/settings.py); a flag overrides its setting. `parley voice` clones, lists and
removes the user's saved voices (engine/voice_library.py), which `say --voice` and `chat --voice` speak in. `parley
serve` speaks for other programs, and `chat --speech-server` and `say --server` speak through it from another
computer."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

from engine.errors import ParleyError

WYOMING_PORT = 10200  # Home Assistant's default port for a Wyoming text-to-speech service


def _voice(folder: Path, config, speaker: str | None, language: str | None,
           instruct: str | None) -> tuple[str | None, str, str | None]:
    """(speaker, language, instruct) to speak in, checked against the model's config.json before its weights load,
    so a misspelt name is told at once, not after a load or a first GPU use's compile. A voice given on the command
    line is taken as it is (an error if the model lacks it); the rest come from the settings, fitted to the model
    (engine.assistant.configured_voice: a speaker saved for another model gives way to this one's first, with a
    warning). A config.json that cannot be read is left to load_tts, which names the fault and how to get the model.

    Raises:
        InputTextError: a speaker, language or style the model does not take (naming the ones it has).
    """
    from engine.errors import ModelFilesError
    from engine.tts.config import TTSConfig

    try:
        model = TTSConfig.from_file(folder / "config.json")
    except ModelFilesError:
        return speaker or config.speaker or None, language or config.language, instruct or config.style or None
    return _fitted_voice(model, config, speaker, language, instruct)


def _fitted_voice(model, config, speaker: str | None, language: str | None,
                  instruct: str | None) -> tuple[str | None, str, str | None]:
    """_voice's choice for `model`: a TTSConfig, or a speech server's ServedModel (what it says it speaks).

    Raises:
        InputTextError: a speaker, language or style the model does not take (naming the ones it has).
    """
    from engine.assistant import configured_voice
    from engine.tts.prompt import resolve_voice

    fitted = configured_voice(model, config)
    if fitted.not_found is not None and not speaker:
        _err(_not_found(fitted.not_found))
    speaker = speaker or fitted.speaker or model.default_speaker
    language = language or fitted.language
    instruct = fitted.style if instruct is None else instruct
    resolve_voice(model, speaker, language, instruct)
    return speaker, language, instruct


def _not_found(event) -> str:
    return (f"parley: warning: this speech model has no voice {event.speaker!r} ({', '.join(event.speakers)}); "
            f"speaking as {event.used!r}")


def _device_of(setting: str) -> str:
    """The engine's device setting as load_tts takes it: "auto" is the GPU where torch finds one."""
    if setting != "auto":
        return setting
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_tts(folder: Path, device: str, config, dtype: str | None = None):
    """load_tts on a model folder, on the CPU in the settings' speech precision unless a dtype is named, saying first
    when it compiles the GPU kernel: a first use of a kernel version spends about a minute there, which would
    otherwise look like a hang."""
    from engine.tts import load_tts

    if device.startswith("cuda"):
        from engine.tts.kernels.build import needs_build

        if needs_build():
            print("parley: compiling the GPU kernel (first use of this version, about a minute)", file=sys.stderr,
                  flush=True)
        return load_tts(folder, device=device, dtype=dtype)
    return load_tts(folder, device=device, dtype=dtype, precision="auto" if dtype else config.speech_precision)


def _say(args) -> int:
    from engine.text import clean_text, speech_seconds

    if args.server:
        here = [flag for flag, value in (("--voice", args.voice), ("--model", args.model), ("--device", args.device),
                                         ("--dtype", args.dtype)) if value is not None]
        if here:
            raise ParleyError(f"{', '.join(here)} {'is' if len(here) == 1 else 'are'} for a speech model on this "
                              f"computer; the server at {args.server} speaks its own model's voices (choose one with "
                              "--speaker)")
    elif args.token is not None:
        raise ParleyError("--token is a speech server's token: give the server's address with --server")
    out = Path(args.out) if args.out else None
    # checked before stdin is read or a model loaded: the temporary file goes beside the target
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        problem = "it is a folder" if out.is_dir() else f"the folder {out.parent} does not exist"
        raise ParleyError(f"cannot write {out}: {problem}; choose another --out")
    text = sys.stdin.read() if args.text in (None, "-") else args.text
    cleaned = clean_text(text)  # nothing to speak is said before a model loads (a first GPU use compiles a minute)
    voice = None
    if args.server:
        tts, speaker, language, instruct = _served_speech(args)
        who = speaker
    else:
        config, choice = _speech(args)
        voice = choice.voice
        if voice is not None:
            speaker, language, instruct = None, args.language or config.language, args.instruct
            _check_saved_voice(choice, language, instruct)
            who = f"the saved voice {choice.name!r}"
        else:
            speaker, language, instruct = _voice(choice.folder, config, args.speaker, args.language, args.instruct)
            who = speaker
        t0 = time.perf_counter()
        tts = _load_tts(choice.folder, args.device or _device_of(config.device), config, args.dtype)
        arithmetic = f" ({tts.precision.setting})" if tts.device.type == "cpu" else ""
        print(f"loaded {tts.folder} on {tts.device}{arithmetic} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    stream = tts.stream(text, speaker, language, instruct=instruct, voice=voice, seed=args.seed)
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
    print(f"{where}: {seconds:.2f} s of speech by {who} (seed {stream.seed}); "
          f"TTFC {1000 * (progress.ttfc_s or 0):.0f} ms, RTF {rtf:.3f}", file=sys.stderr)
    return 0


def _speech(args):
    """(config, SpeechChoice) of `say`: --voice speaks in that saved voice (--model then names the Base model), as
    does the app's saved voice where neither --speaker, --instruct nor --model asks for a speaker's model; a saved
    voice of the settings that cannot be spoken gives way to the speaker with a warning, one asked for is an error.

    Raises:
        VoiceNameError, VoiceFileError, ModelFilesError, InputTextError: the saved voice asked for cannot be spoken.
    """
    from engine.assistant import speech_choice
    from engine.settings import load_config

    if args.voice:
        config = load_config(saved_voice=args.voice, base_model=args.model)
    else:
        config = load_config(tts_model=args.model)
        if args.speaker or args.instruct or args.model:
            config = dataclasses.replace(config, saved_voice="")
    choice = speech_choice(config)
    if choice.problem is not None:
        if args.voice:
            raise choice.problem
        _err(f"parley: warning: speaking as the speech model's speaker instead of the saved voice "
             f"{config.saved_voice!r}: {choice.problem}")
    return config, choice


def _served_speech(args):
    """(RemoteTTS, speaker, language, instruct) of `say --server`: the server, once it has said what its model speaks,
    and the voice fitted to that model as to one here (the settings' voice where it has it). A saved voice of the
    settings gives way to the server's speaker with a warning: it is spoken on this computer only.

    Raises:
        SpeechServerError: the server cannot be reached, refuses the token, or is not a Parley speech server.
        InputTextError: a speaker, language or style its model does not take (naming the ones it has).
    """
    from engine.settings import load_config
    from engine.speech_client import connect_tts

    config = load_config()
    if config.saved_voice and not (args.speaker or args.instruct):
        _err(f"parley: warning: speaking as the server's speaker instead of the saved voice {config.saved_voice!r}: "
             "a saved voice is spoken on this computer only")
    t0 = time.perf_counter()
    tts = connect_tts(args.server, _speech_token(args.token, args.server))
    print(f"parley: {tts.folder.name} on {tts.url} answered in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    return (tts, *_fitted_voice(tts.config, config, args.speaker, args.language, args.instruct))


def _check_saved_voice(choice, language: str, instruct: str | None) -> None:
    """The language and style asked for, checked against the Base model's config.json before its weights load."""
    from engine.errors import ModelFilesError
    from engine.tts.config import TTSConfig
    from engine.tts.prompt import resolve_voice

    try:
        model = TTSConfig.from_file(choice.folder / "config.json")
    except ModelFilesError:  # loading it names what is wrong
        return
    resolve_voice(model, None, language, instruct, choice.voice)


def _voices(args) -> int:
    """`parley voice add|list|remove|rename`: the saved voices (engine/voice_library.py)."""
    from engine.voice_library import VoiceLibrary

    library = VoiceLibrary()
    if args.action == "list":
        voices = library.list()
        if not voices:
            print(f"No saved voices in {library.folder}; clone one with: parley voice add NAME --audio FILE")
            return 0
        width = max(len(v.name) for v in voices)
        for v in voices:
            if v.damaged:
                print(f"{v.name:<{width}}  damaged: {v.problem}")
                continue
            heard = f'  "{v.transcript}"' if v.transcript else ""
            print(f"{v.name:<{width}}  {_MODES[v.mode]:<10}  {_SIZES.get(v.model_size, v.model_size or '?')} Base  "
                  f"{v.saved.astimezone():%Y-%m-%d %H:%M}{heard}")
        print(f"({library.summary()} in {library.folder})")
        return 0
    if args.action == "remove":
        gone = library.remove(args.name)
        print(f"removed the saved voice {gone.name!r} ({gone.path})")
        return 0
    if args.action == "rename":
        renamed = library.rename(args.name, args.new_name)
        print(f"renamed to {renamed.name!r} ({renamed.path})")
        return 0
    return _voice_add(args, library)


_MODES = {"icl": "in-context", "x_vector": "x-vector"}
_SIZES = {"0b6": "0.6B", "1b7": "1.7B"}


def _voice_add(args, library) -> int:
    """Clone --audio's voice with the Base model and save it; in "icl" mode without --text, Whisper hears the
    recording and what it heard is printed."""
    from engine.models import find_base_model
    from engine.settings import load_config

    config = load_config(base_model=args.model)
    device = args.device or _device_of(config.device)
    folder = find_base_model(config.base_model or None)  # a missing model is told before Whisper listens

    def engine():
        t0 = time.perf_counter()
        tts = _load_tts(folder, device, config)
        print(f"parley: loaded {tts.folder} on {tts.device} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return tts

    def transcribe(audio_16k) -> str:
        from engine.catalogue import downloaded
        from engine.stt import Transcriber, TranscriberOptions

        whisper = Transcriber(config.stt_model or downloaded("stt"), TranscriberOptions(device=device.split(":")[0]))
        heard = whisper.transcribe(audio_16k).text
        _err(f'parley: heard "{heard}" (give --text if the recording says something else)')
        return heard

    saved = library.clone(engine, args.name, args.audio, text=args.text, mode=args.mode, replace=args.replace,
                          transcribe=transcribe)
    print(f"saved the voice {saved.name!r} ({_MODES[saved.mode]}, {_SIZES.get(saved.model_size, saved.model_size)} "
          f"Base) in {saved.path}; speak in it with: parley say --voice {shlex.quote(saved.name)} \"TEXT\"")
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
            raise ParleyError(f"output device {player.device.name} stopped playing; "
                              "choose another with --output-device")
        return elapsed, f"played on {player.device.name}"


def _chat(args) -> int:
    from engine.assistant import Assistant
    from engine.errors import MicrophoneAccessError
    from engine.history import history_path
    from engine.models import find_tts_model
    from engine.settings import load_config

    config = load_config(tts_model=args.model, stt_model=args.whisper, llm_model=args.llm,
                         speaker=args.speaker, saved_voice=args.voice, input_device=args.input_device,
                         output_device=args.output_device,
                         silence_ms=args.silence_ms, longest_pause_ms=args.longest_pause_ms,
                         turn_detection=args.turn_detection, listen_mode=args.listen_mode, device=args.device,
                         history_file=history_path(args.profile), voice_input=not args.text,
                         speech_server=args.speech_server,
                         speech_token=_speech_token(args.speech_token, args.speech_server),
                         live_transcript=False)  # a terminal shows what was heard once it is final
    if args.speaker and not args.voice:  # the app's saved voice gives way to a speaker asked for
        config = dataclasses.replace(config, saved_voice="")
    if args.speaker and not config.speech_server:  # a misspelt name is told at once, not after loading three models
        _voice(find_tts_model(config.tts_model or None), config, args.speaker, None, None)
    if args.voice:  # so is a saved voice that cannot be spoken
        from engine.assistant import speech_choice

        problem = speech_choice(config).problem
        if problem is not None:
            raise problem
    printer = _Printer(typed=args.text)
    with Assistant(config, subscribe=printer) as assistant:
        assistant.load()
        if printer.voice_off is not None and not isinstance(printer.voice_off, MicrophoneAccessError):
            raise printer.voice_off  # the microphone or Whisper model asked for cannot be used: say which
        info = assistant.info
        voice = f"the saved voice {info.saved_voice!r}" if info.saved_voice else f"voice {info.speaker}"
        speech = f"{info.tts_model.name} on {info.speech_server}" if info.speech_server else info.tts_model.name
        about = f"parley: {info.llm_model.name} and {speech}, {voice}"
        if info.microphone is None:  # typed, or the microphone may not be opened: the conversation goes on typed
            printer.typed = True
            return _typed_chat(assistant, printer, about)
        return _voice_chat(assistant, about)


def _speech_token(token: str | None, server: str | None) -> str | None:
    """The token for a speech server (`chat --speech-server`, `say --server`): the flag's, else, for a server named on
    the command line, PARLEY_API_TOKEN (the variable `parley serve` reads: one name for one secret on both ends); None
    keeps the settings' token, which goes only to the settings' server."""
    if token is not None:
        return token
    if server:
        return os.environ.get("PARLEY_API_TOKEN", "")
    return None


def _models(args) -> int:
    """What each model is and where it was found (as the app's Models page says), what Parley recommends for this
    computer, and, with --download, fetching it (checked against the hub's hashes, resumable; into Parley's models
    folder, where the app and `parley chat` find it on their own)."""
    from engine.catalogue import CLONING, this_machine, to_download
    from engine.downloads import DownloadError, NoNetworkError, download_command, download_model
    from engine.models import locate_model
    from engine.settings import read_settings

    stored = read_settings()
    titles = {"tts": "Voice (speech model)", "stt": "Hearing (Whisper)", "llm": "Thinking (language model)",
              "clone": "Voice cloning (Base model, for saved voices)"}
    settings = {"tts": "tts_model", "stt": "stt_model", "llm": "llm_model", "clone": "base_model"}
    found = {kind: locate_model(kind, str(stored.get(settings[kind], ""))) for kind in titles}
    for kind, title in titles.items():
        state = "ready" if found[kind].path else "cannot be read" if found[kind].damaged else "missing"
        print(f"{title}: {state}. {found[kind].headline}")
    wanted = to_download(found, this_machine())
    cloning = found["clone"].path is None and (found["clone"].damaged or not CLONING.download_folder().exists())
    if cloning and args.cloning:
        wanted.append(CLONING)
    elif cloning:  # only those who clone a voice want it: offered, not recommended
        print(f"To clone voices: {CLONING.name} ({CLONING.size}, {CLONING.licence}), {CLONING.why}; "
              "parley models --download --cloning fetches it")
    if not wanted:
        print("Nothing to download: Parley has what it recommends for this computer.")
        return 0
    print("Recommended for this computer:")
    for offer in wanted:
        print(f"  {offer.name} ({offer.size}, {offer.licence}): {offer.why}\n"
              f"    {download_command(offer.repo_id, offer.download_folder(), offer.files)}")
    if not args.download:
        print(f"Download them with: parley models --download{' --cloning' if args.cloning else ''}")
        return 0
    for offer in wanted:
        progress = _DownloadProgress(offer.name)
        try:
            download_model(offer.repo_id, offer.download_folder(), files=offer.files, progress=progress,
                           replace=offer.download_folder().exists())
        except NoNetworkError:
            progress.end("no network")
            print("parley: no network here: run the commands above on a computer that has one, then copy the "
                  "folders to the same place here", file=sys.stderr)
            return 2
        except DownloadError:
            progress.end("failed")
            raise
        progress.end(f"done: {offer.downloaded_path()}")
    return 0


class _DownloadProgress:
    """A download's progress on one line of standard error, rewritten as it grows."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, done: int, total: int) -> None:
        share = f"{done / total:.0%} of {total / 1e9:.2f} GB" if total else "asking the hub"
        sys.stderr.write(f"\r{self.name}: {share}   ")
        sys.stderr.flush()

    def end(self, how: str) -> None:
        sys.stderr.write(f"\r{self.name}: {how}\n")
        sys.stderr.flush()


def _serve(args) -> int:
    """The speech engine on the OpenAI audio API's speech route (engine/speech_server.py), or with --wyoming as a
    Wyoming service (engine/wyoming_server.py), until Ctrl-C."""
    if args.wyoming is not None:
        return _serve_wyoming(args)
    import uvicorn

    from engine.speech_server import DEFAULT_CONCURRENCY, ServiceOptions, create_app

    host, port = args.host or "127.0.0.1", 8000 if args.port is None else args.port
    max_waiting = 8 if args.max_waiting is None else args.max_waiting
    token = args.token or os.environ.get("PARLEY_API_TOKEN") or None
    if token is None and not _loopback(host):
        raise ParleyError(f"serving on {host} lets other computers in: give them a token to send (--token, or "
                          "PARLEY_API_TOKEN), or serve on 127.0.0.1")
    tts = _served_tts(args, "engine.speech_server")
    at_once = args.concurrency or DEFAULT_CONCURRENCY[tts.device.type]
    print(f"parley: serving {tts.folder.name} on {tts.device} at http://{host}:{port}/v1 (the OpenAI audio "
          f"API's speech route{', token required' if token else ''}; {at_once} at once, {max_waiting} waiting); "
          "Ctrl-C stops", file=sys.stderr, flush=True)
    app = create_app(tts, ServiceOptions(token=token, concurrency=at_once, max_waiting=max_waiting))
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0


def _serve_wyoming(args) -> int:
    """The speech engine as a Wyoming text-to-speech service (engine/wyoming_server.py), for Home Assistant's Assist,
    until Ctrl-C (or SIGTERM). The protocol has no authentication, so beyond the loopback interface it is said aloud."""
    import asyncio
    import signal

    from engine.speech_server import DEFAULT_CONCURRENCY
    from engine.wyoming_server import start_server

    http_only = [flag for flag, value in (("--host", args.host), ("--port", args.port), ("--token", args.token),
                                          ("--max-waiting", args.max_waiting)) if value is not None]
    if http_only:
        raise ParleyError(f"{', '.join(http_only)} {'is' if len(http_only) == 1 else 'are'} for the HTTP API; the "
                          "Wyoming service takes its address in --wyoming [HOST:]PORT and has no token")
    host, port = args.wyoming
    if not _loopback(host):  # said before the model loads, so it is not lost among what follows
        _err(f"parley: warning: the Wyoming protocol has no authentication: anyone who can reach {host}:{port} can "
             "make Parley speak; serve on a network you trust (Home Assistant's), or on 127.0.0.1")
    tts = _served_tts(args, "engine.wyoming_server")
    at_once = args.concurrency or DEFAULT_CONCURRENCY[tts.device.type]

    async def serve() -> None:
        try:
            server = await start_server(tts, host, port, at_once)
        except OSError as e:
            raise ParleyError(f"cannot listen on {host}:{port} ({e.strerror or e}); choose another with --wyoming "
                              "[HOST:]PORT") from None
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        _err(f"parley: serving {tts.folder.name} on {tts.device} to Wyoming clients (Home Assistant: add the Wyoming "
             f"Protocol integration with host and port) at tcp://{host}:{port}, {at_once} at once; Ctrl-C stops")
        await stop.wait()
        await server.stop()

    asyncio.run(serve())
    return 0


def _served_tts(args, logger: str):
    """The speech engine `parley serve` speaks with, loaded; the server module's request lines (TTFC, RTF) are shown
    on stderr, its warnings once (by the engine's own handler, _show_warnings)."""
    from engine.models import find_tts_model
    from engine.settings import load_config

    config = load_config(tts_model=args.model)
    folder = find_tts_model(config.tts_model or None)
    tts = _load_tts(folder, args.device or _device_of(config.device), config)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("parley: %(message)s"))
    handler.addFilter(lambda record: record.levelno < logging.WARNING)
    requests = logging.getLogger(logger)
    requests.addHandler(handler)
    requests.setLevel(logging.INFO)
    return tts


def _at_least_one(value: str) -> int:
    """`serve --concurrency`'s type: a whole number of 1 or more."""
    if not value.isdecimal() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"'{value}' is not a number of utterances; give 1 or more")
    return int(value)


def _wyoming_address(value: str) -> tuple[str, int]:
    """`serve --wyoming`'s type: [HOST:]PORT, the host 127.0.0.1 where none is given (an IPv6 one in brackets)."""
    host, _, port = value.rpartition(":")
    if not port.isdecimal() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"'{value}' is not [HOST:]PORT; for example 10200 or 0.0.0.0:10200")
    return host.strip("[]") or "127.0.0.1", int(port)


def _loopback(host: str) -> bool:
    """Whether only this computer can reach `host`."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _figures(metrics) -> str:
    from engine.metrics import FIGURES, LABELS, format_figure

    figures = metrics.as_dict()
    return "  [" + ", ".join(f"{LABELS[name]} {format_figure(name, figures[name])}" for name in FIGURES
                             if name in figures) + "]"


class _Printer:
    """The assistant's events as `parley chat` shows them: what was heard and each reply on stdout (the conversation
    itself), the rest on stderr. A reply is printed as a whole once spoken, so stderr's figures follow the text they
    belong to; typed turns are prefixed 'parley: ' only beside spoken ones."""

    def __init__(self, typed: bool):
        self.typed = typed
        self.turn_done = threading.Event()  # set when a turn finishes or fails
        self.voice_off: Exception | None = None  # why speech recognition or the microphone could not be opened

    def __call__(self, event) -> None:
        from engine import events as e
        from engine.errors import MicrophoneAccessError

        match event:
            case e.Loading(label=label) if label:  # a step that takes long for a reason: said, not a seeming hang
                _err(f"parley: loading the {label}")
            case e.VoiceInputOff():
                self.voice_off = event.error
                if isinstance(event.error, MicrophoneAccessError):  # the others end the command: said then
                    _err(f"parley: {event.message}")
            case e.VoiceNotFound():
                _err(_not_found(event))
            case e.SavedVoiceUnavailable():
                _err(f"parley: warning: {event.message}")
            case e.Notice() | e.TurnFailed() | e.DeviceLost() | e.DeviceRestored():
                _err(f"parley: {event.message}")
            case e.Heard():
                _out(f"you: {event.text}")
            case e.BargeIn():
                _err("  [interrupted]")
            case e.TurnFinished():
                _out(event.result.reply_text if self.typed else f"parley: {event.result.reply_text}")
                _err(_figures(event.result.metrics))
        if isinstance(event, (e.TurnFinished, e.TurnFailed)):
            self.turn_done.set()


def _out(text: str) -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _typed_chat(assistant, printer: _Printer, about: str) -> int:
    """A typed line a turn, each spoken before the next is read; an empty line or Ctrl-D ends."""
    _err(f"{about}; type a message, an empty line or Ctrl-D ends")
    for line in sys.stdin:
        text = line.strip()
        if not text:
            break
        printer.turn_done.clear()
        assistant.send(text)
        printer.turn_done.wait()
    return 0


def _voice_chat(assistant, about: str) -> int:
    """The microphone conversation until Ctrl-C; push-to-talk: Enter starts and ends each turn, Ctrl-D quits."""
    info, push_to_talk = assistant.info, assistant.config.listen_mode == "push-to-talk"
    how = ("press Enter to talk and Enter again when done; Ctrl-D quits" if push_to_talk
           else "speak when you like (typed lines are turns too); Ctrl-C quits")
    _err(f"{about}; hearing {info.microphone}, speaking on {info.speakers_device}; {how}")
    try:
        talking = False
        for line in sys.stdin:
            if push_to_talk:
                talking = not talking
                assistant.press() if talking else assistant.release()
                _err("  [talking: press Enter when done]" if talking else "  [thinking]")
            elif line.strip():
                assistant.send(line.strip())
        if not push_to_talk:  # no more typing (stdin closed, or none): keep listening
            threading.Event().wait()
    except KeyboardInterrupt:
        _err("")
    return 0


def _device(value: str) -> str:
    """`say --device`'s type: cpu, cuda or cuda:N (argparse's usage error otherwise, not a traceback from the
    engine)."""
    if re.fullmatch(r"cpu|cuda(:\d+)?", value) is None:
        raise argparse.ArgumentTypeError(f"'{value}' is not a device; choose cpu, cuda or cuda:N")
    return value


def _engine_device(value: str) -> str:
    """`chat --device`'s type: one of the engine's device settings, for all three models."""
    from engine.settings import ENGINE_DEVICES

    if value not in ENGINE_DEVICES:
        raise argparse.ArgumentTypeError(f"'{value}' is not a device; choose {', '.join(ENGINE_DEVICES)}")
    return value


def _milliseconds(bounds: tuple[int, int]):
    """The type of a pause flag: a whole number of milliseconds within the setting's bounds, checked before the
    models load."""
    low, high = bounds

    def parse(value: str) -> int:
        if not value.isdecimal() or not low <= int(value) <= high:
            raise argparse.ArgumentTypeError(f"'{value}' is not a whole number of milliseconds in {low}..{high}")
        return int(value)

    return parse


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
    from engine.settings import LONGEST_PAUSE_MS_RANGE, SILENCE_MS_RANGE

    _show_warnings()
    parser = argparse.ArgumentParser(prog="parley", description="Parley: a private, offline voice assistant.")
    commands = parser.add_subparsers(dest="command", required=True)
    settings = "default: the app's setting, else"  # engine/settings.py: the file the app writes
    say = commands.add_parser("say", help="speak text on the speakers, or into a WAV file")
    say.add_argument("text", nargs="?", help="what to say; '-' or nothing reads standard input")
    say.add_argument("--out", help="write a WAV file (24 kHz mono) instead of playing")
    say.add_argument("--output-device",
                     help="speaker to play on: a name, part of one, or an index (default: the system's)")
    say.add_argument("--model", help=f"checkpoint folder or hub id ({settings} Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice; "
                     "with --voice, the Base model it was cloned with)")
    who = say.add_mutually_exclusive_group()
    who.add_argument("--speaker", help=f"voice name ({settings} the model's first)")
    who.add_argument("--voice", help="a saved voice's name (parley voice list), spoken by the Base model it was "
                     f"cloned with ({settings} none)")
    say.add_argument("--language", help=f"language name or 'auto' ({settings} auto)")
    say.add_argument("--instruct", help=f"speaking style (1.7B) or voice description (VoiceDesign) ({settings} none)")
    say.add_argument("--seed", type=int, help="makes the speech reproducible")
    say.add_argument("--device", type=_device, help=f"cpu or cuda (cuda:N: the Nth GPU) ({settings} the GPU "
                     "where there is one)")
    say.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                     help="default: bfloat16 on a GPU; on the CPU, the settings' speech precision (the fastest the "
                     "CPU allows, int8 where it has AVX2)")
    say.add_argument("--server", metavar="URL", help="speak through a Parley speech server (parley serve, or its Ray "
                     "Serve cluster, e.g. http://192.168.1.20:8000) instead of a speech model on this computer")
    say.add_argument("--token", help="the token that server was given (default: PARLEY_API_TOKEN); the variable keeps "
                     "it out of the process list")
    chat = commands.add_parser("chat", help="talk with Parley through the microphone: replies are printed and spoken")
    chat.add_argument("--text", action="store_true", help="type your turns on standard input (one a line) instead")
    mode = chat.add_mutually_exclusive_group()
    mode.add_argument("--push-to-talk", dest="listen_mode", action="store_const", const="push-to-talk",
                      help=f"Enter starts and ends each spoken turn ({settings} hands-free)")
    mode.add_argument("--hands-free", dest="listen_mode", action="store_const", const="hands-free",
                      help="a pause ends each spoken turn")
    chat.add_argument("--turn-detection", action=argparse.BooleanOptionalAction,
                      help="hands-free: after a short pause, tell from the voice whether you have finished "
                      f"({settings} on)")
    chat.add_argument("--silence-ms", type=_milliseconds(SILENCE_MS_RANGE),
                      help=f"hands-free without turn detection: the pause that ends a turn ({settings} 700 ms)")
    chat.add_argument("--longest-pause-ms", type=_milliseconds(LONGEST_PAUSE_MS_RANGE),
                      help=f"with turn detection: the longest pause to think ({settings} 2000 ms)")
    chat.add_argument("--input-device", help=f"microphone: a name, part of one, or an index ({settings} the system's)")
    chat.add_argument("--output-device", help=f"speaker: a name, part of one, or an index ({settings} the system's)")
    chat.add_argument("--whisper", help=f"Whisper model: a CTranslate2 folder or hub name ({settings} "
                      "the bundled base)")
    chat.add_argument("--model", help=f"TTS checkpoint folder or hub id ({settings} "
                      "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice)")
    chat.add_argument("--llm", help=f"GGUF chat model file ({settings} the bundled SmolLM2-135M-Instruct)")
    chat.add_argument("--speech-server", metavar="URL", help="speak through a Parley speech server (parley serve on "
                      f"another computer, e.g. http://192.168.1.20:8000); '' speaks on this one ({settings} this "
                      "computer)")
    chat.add_argument("--speech-token", metavar="TOKEN", help="the token that server was given (default: "
                      "PARLEY_API_TOKEN with --speech-server, else the settings'); the variable keeps it out of the "
                      "process list")
    chat_who = chat.add_mutually_exclusive_group()
    chat_who.add_argument("--speaker", help=f"voice name ({settings} the TTS model's first)")
    chat_who.add_argument("--voice", help=f"a saved voice's name (parley voice list) ({settings} none)")
    chat.add_argument("--device", type=_engine_device, help=f"auto, cuda or cpu, for the three models ({settings} "
                      "auto: the GPU where there is one)")
    chat.add_argument("--profile", default="default", help="whose history the turns are saved in")
    serve = commands.add_parser("serve", help="speak for other programs: the OpenAI audio API's speech route, or "
                                "the Wyoming protocol (Home Assistant)")
    serve.add_argument("--host", help="the address the HTTP API listens on (default: 127.0.0.1, this computer only)")
    serve.add_argument("--port", type=int, help="the HTTP API's port (default: 8000)")
    serve.add_argument("--token", help="the bearer token clients must send (or PARLEY_API_TOKEN); needed beyond "
                                       "this computer")
    serve.add_argument("--concurrency", type=_at_least_one, metavar="N",
                       help="utterances spoken at once, taking turns on the one engine a chunk at a time and on a GPU "
                       "sharing its launches (default: 2 on the CPU, 8 on a GPU; each speaks at the engine's speed "
                       "shared among them)")
    serve.add_argument("--max-waiting", type=int, help="requests that may wait while those are spoken (default: 8)")
    serve.add_argument("--wyoming", nargs="?", const=f"127.0.0.1:{WYOMING_PORT}", type=_wyoming_address,
                       metavar="[HOST:]PORT",
                       help="serve the Wyoming protocol instead, for Home Assistant's Assist (default: "
                       f"127.0.0.1:{WYOMING_PORT}, this computer only). It has no authentication: on 0.0.0.0 anyone "
                       "on the network may make Parley speak")
    serve.add_argument("--model", help=f"checkpoint folder or hub id ({settings} Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice)")
    serve.add_argument("--device", type=_device, help=f"cpu or cuda ({settings} the GPU where there is one)")
    models = commands.add_parser("models", help="what models Parley has, and what it recommends for this computer")
    models.add_argument("--download", action="store_true", help="download the recommended models not here yet")
    models.add_argument("--cloning", action="store_true", help="with them, the voice-cloning model (Qwen3-TTS 0.6B "
                        "Base, about 2 GB) that parley voice add and saved voices need")
    voice = commands.add_parser("voice", help="your saved voices: clone one from a recording, list, rename, remove")
    actions = voice.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="clone a voice from 3-30 s of one person speaking (5-20 s is best) and "
                             "save it")
    add.add_argument("name", help="what to call it (any language; not one already saved, however capitalised)")
    add.add_argument("--audio", required=True, help="the recording: a WAV, FLAC or OGG file")
    add.add_argument("--text", help="what the recording says, word for word (default: Whisper hears it)")
    add.add_argument("--mode", choices=("icl", "x_vector"), default="icl",
                     help="icl: the closest likeness, from the recording's sound and words (default); x_vector: "
                     "from its sound alone, no transcript")
    add.add_argument("--model", help=f"Base checkpoint folder or hub id ({settings} Qwen/Qwen3-TTS-12Hz-0.6B-Base)")
    add.add_argument("--replace", action="store_true", help="replace a saved voice of that name")
    add.add_argument("--device", type=_device, help=f"cpu or cuda ({settings} the GPU where there is one)")
    actions.add_parser("list", help="the saved voices, with their kind, model, date and transcript")
    remove = actions.add_parser("remove", help="delete a saved voice")
    remove.add_argument("name")
    rename = actions.add_parser("rename", help="give a saved voice another name")
    rename.add_argument("name")
    rename.add_argument("new_name")
    args = parser.parse_args(argv)
    try:
        return {"say": _say, "chat": _chat, "serve": _serve, "models": _models, "voice": _voices}[args.command](args)
    except ParleyError as e:
        print(f"parley: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
