"""The streaming speech engine: text in, 24 kHz PCM chunks out while the model is still generating.

`load_tts` reads a checkpoint folder (config, weights, Qwen tokenizer, speech_tokenizer/ codec; a Base
model's speaker encoder and the codec's encoder too); `TTSEngine.stream` validates its input at once, then
decodes lazily: each frame's 16 codes go through the stateful codec as soon as they are sampled, so the first
chunk costs a prefill, one frame and one frame of codec decode. A Base model speaks in a voice that
`TTSEngine.clone_voice` made from a recording (engine/tts/clone.py). Several streams may be iterated at once, from
threads of their own: they take turns on the engine a chunk at a time, the one whose listener runs out of audio
soonest first (engine/tts/turns.py), and with the megakernel share its launches (engine/tts/kernels/batcher.py).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from engine.errors import GPUUnavailableError, InputTextError, ModelFilesError, ModelMissingError
from engine.models import redownload_advice
from engine.tts.checkpoint import load_weights
from engine.tts.chunks import CHUNK_FRAMES, chunk_size
from engine.tts.clone import ClonedVoice, clone_voice
from engine.tts.codec import StreamState, load_codec
from engine.tts.config import TTSConfig, read_json
from engine.tts.encoder import SpeechEncoder, load_speech_encoder
from engine.tts.cpu import PRECISIONS, Precision, choose_precision, quantize, speed_up_codec
from engine.tts.model import Qwen3TTS
from engine.tts.prefill import attach_graphs
from engine.text import clean_text
from engine.tts.prompt import PromptBuilder, Voice, load_tokenizer, resolve_voice, split_text
from engine.tts.sampling import Sampler, SamplingOptions, new_seed
from engine.tts.speaker import SpeakerEncoder, load_speaker_encoder
from engine.tts.turns import Turns

log = logging.getLogger(__name__)

# Runaway cap: the official model misses EOS in ~0.3-0.5% of runs. Speech runs at 12.5 frames/s and
# even slow CJK speech (~2.5 characters/s) needs < 5 frames per character, so 6 per character plus a
# 2 s floor never cuts real speech and ends a runaway within seconds.
FRAMES_PER_CHAR = 6
MIN_FRAMES_CAP = 25
# Long text is spoken in segments of at most this many characters, each its own prefill.
SEGMENT_CHARS = 400
_ENDED = object()  # an utterance's chunks have run out


@dataclass(frozen=True)
class Chunk:
    """A piece of streamed speech."""

    pcm: np.ndarray  # float32 (frames * frame_samples,) at the engine's sample_rate_hz, in [-1, 1]
    codes: np.ndarray  # int64 (frames, 16): the codec frames this audio was decoded from
    segment: int  # index of the text segment these frames belong to
    t_ready: float  # time.perf_counter() when pcm was in host memory


class TTSStream:
    """An iterator of Chunks for one utterance. Iterating does the work.

    Leaving the loop (break, close(), an exception) stops at the next frame; another thread stops it
    with cancel(). `t_start` is when the text was handed over (the TTFC origin); `seed` reproduces it;
    `segments` is how many parts the text is spoken in (a Chunk's `segment` counts them from 0).
    `notice` is None, or the GPUUnavailableError saying that the GPU ran out of memory (in this stream or another
    one of the engine's) and the engine moved to the CPU; the segment that was speaking then started again from its
    first frame. Streams of one engine may be iterated at once from different threads (each stream from one thread at
    a time): each chunk is made in a turn of the engine's, the stream due soonest first (engine/tts/turns.py).
    """

    def __init__(self, run, seed: int, segments: int):
        self.seed, self.segments = seed, segments
        self.t_start = time.perf_counter()
        self.notice: GPUUnavailableError | None = None
        self._cancelled = threading.Event()
        self._chunks = run(self._cancelled, self)

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        return next(self._chunks)

    def cancel(self) -> None:
        """Stop at the next frame (thread-safe); the iterator then ends."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def close(self) -> None:
        self._chunks.close()


class _Moved(Exception):
    """Another stream's turn moved the engine to the CPU (its GPU ran out of memory): this one's segment starts
    again there."""


class TTSEngine:
    """Qwen3-TTS on one device: speakers and languages from the checkpoint, speech as a stream (several at once)."""

    def __init__(self, folder: Path, config: TTSConfig, model: Qwen3TTS, prompts: PromptBuilder, codec,
                 sampling: SamplingOptions, max_frames: int, precision: Precision,
                 megakernel_problem: str | None = None, speaker_encoder: SpeakerEncoder | None = None,
                 speech_encoder: SpeechEncoder | None = None):
        self.folder, self.config, self.model, self.prompts, self.codec = folder, config, model, prompts, codec
        # how the model computes (int8 weights, bfloat16 codec, ...): str(precision) is the line to show a user
        self.precision = precision
        # a Base model's: the recording -> speaker embedding, and -> codec codes (None for the other models)
        self.speaker_encoder, self.speech_encoder = speaker_encoder, speech_encoder
        # an in-context cloned voice -> the codec's state after its recording's codes, made on the voice's first use
        self._contexts: weakref.WeakKeyDictionary[ClonedVoice, StreamState] = weakref.WeakKeyDictionary()
        self.default_sampling, self.max_frames = sampling, max_frames
        # why load_tts, free to choose, could not run the decode steps in the megakernel (no CUDA compiler, an
        # older GPU, ...): they run on PyTorch, slower; None where the megakernel runs or was not asked for
        self.megakernel_problem = megakernel_problem
        self.device = next(model.parameters()).device
        # the frame kernel's launches, which utterances spoken at once share (None: no megakernel)
        self._launches = None
        if model.frame_kernel is not None:
            from engine.tts.kernels.batcher import Batcher

            self._launches = Batcher(model)
        # the device's turns: the model's buffers (the prefill's, the megakernel's, the codec graphs') serve one
        # stream at a time, and each stream's own state lives in its own tensors between its turns
        self._turns = Turns()
        self.dtype = getattr(torch, precision.activations)
        talker = config.talker
        vocab = talker.decoder.vocab_size
        # the official generate() suppresses the top 1024 codec ids (specials), EOS excepted
        self._suppress = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self._suppress[vocab - 1024:] = True
        self._suppress[talker.codec_eos_id] = False

    @property
    def speakers(self) -> list[str]:
        return self.config.speakers

    @property
    def languages(self) -> list[str]:
        return self.config.languages

    @property
    def sample_rate_hz(self) -> int:
        return self.codec.config.sample_rate_hz

    @property
    def default_speaker(self) -> str | None:
        """The speaker used when a caller names none: the model's first, or None (VoiceDesign)."""
        return self.config.default_speaker

    def resolve_voice(self, speaker: str | None, language: str | None = "auto", instruct: str | None = None,
                      voice: ClonedVoice | None = None) -> Voice:
        """Check a voice against the checkpoint without speaking (names are case-insensitive).

        Raises:
            InputTextError: an unknown speaker or language (listing the valid ones), a style the model does
                not take, a Base model without a cloned voice, or a cloned voice for another model.
        """
        return resolve_voice(self.config, speaker, language, instruct, voice)

    def clone_voice(self, audio, sample_rate_hz: int | None = None, *, text: str | None = None,
                    mode: str = "icl") -> ClonedVoice:
        """Clone the voice of a recording, once; speak in it with stream(text, voice=...), save it with its save().

        Args:
            audio: a path to an audio file (WAV, FLAC, OGG, ...), or samples: float in [-1, 1] or integer PCM,
                (samples,) or (samples, channels); 3 to 30 s of one person speaking (5 to 20 s is best). Channels
                are mixed down and other rates resampled to 24 kHz.
            sample_rate_hz: the samples' rate; None for a file.
            text: what the recording says, word for word; needed in "icl" mode.
            mode: "icl" (the official default: the recording's codes and transcript go in every prompt, the
                closest likeness) or "x_vector" (its speaker embedding alone; no transcript needed).
        Returns:
            The voice, for this engine's model (and any loaded from the same checkpoint).
        Raises:
            InputTextError: this is not a Base model, or "icl" mode without a transcript.
            ReferenceAudioError: the recording is not audio, too short or too long, silent, or clipped.
            ValueError: an unknown mode, or samples without their sample rate.
        """
        if self.speaker_encoder is None:
            raise InputTextError(f"voice cloning needs a Base model (Qwen3-TTS-12Hz-*-Base); this is a "
                                 f"{self.config.model_type} model")
        voice = clone_voice(self.speaker_encoder, self.speech_encoder, self.config.model_size, audio, sample_rate_hz,
                            text, mode)
        self._codec_context(voice)  # now rather than in the first utterance's time to first audio
        return voice

    def move_to_cpu(self) -> None:
        """Reload the checkpoint on the CPU in place, and free the GPU's copy of the model. A GPU engine comes back
        in precision "auto"; a CPU engine keeps its precision.

        For a GPU that ran out of memory: a stream does it itself (see TTSStream.notice), and whoever holds
        this engine speaks on the CPU from then on. It waits for a turn, so no stream is mid-chunk; the streams
        live then start their segment again on the CPU at their next turn, each with a notice.

        Raises:
            ModelFilesError: the checkpoint can no longer be read; the engine stays as it was.
        """
        with self._turns.turn():
            self._move_to_cpu()

    def _move_to_cpu(self) -> None:
        """move_to_cpu in a turn this thread holds: no other stream is between its frames. The others find the new
        model at their next turn, and start their segment again on it (stream's _Moved)."""
        cpu = load_tts(self.folder, "cpu", precision=self.precision.setting if self.device.type == "cpu" else "auto")
        turns = self._turns  # the one every stream waits on, held by this thread now
        self.__dict__.update(cpu.__dict__)
        self._turns = turns
        _free_gpu()

    def stream(self, text: str, speaker: str | None = None, language: str | None = "auto", *,
               instruct: str | None = None, voice: ClonedVoice | None = None, seed: int | None = None,
               sampling: SamplingOptions | None = None, whole_text: bool | None = None,
               chunk_frames: int = CHUNK_FRAMES) -> TTSStream:
        """Speak `text`; returns a lazy stream of Chunks.

        Args:
            text: any text; control characters are dropped and long text is split into segments.
            speaker: a name from `speakers` (CustomVoice models; case-insensitive).
            language: "auto" or a name from `languages`.
            instruct: speaking style (1.7B CustomVoice) or voice description (VoiceDesign).
            voice: the cloned voice a Base model speaks in (clone_voice, load_voice); the audio holds none of
                its recording.
            seed: makes sampling reproducible; None draws one (the stream's `seed` tells which).
            sampling: how codes are picked; None uses the checkpoint's generation_config.json.
            whole_text: True puts each segment's whole text in the prefill (official non_streaming_mode,
                the default for CustomVoice); False feeds it one token per frame.
            chunk_frames: codec frames per chunk after a segment's first two, which are one frame each
                (engine/tts/chunks.py: the first is the lowest latency to first audio, 80 ms; with the second a
                player can start); later chunks of several frames decode in fewer, larger codec calls while the
                first are playing.

        Raises:
            InputTextError: empty text, unknown speaker or language, a style the model does not take, a Base
                model without a cloned voice, or a cloned voice for another model.
        """
        if chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
        resolved = self.resolve_voice(speaker, language, instruct, voice)
        segments = split_text(clean_text(text), SEGMENT_CHARS)
        seed = new_seed() if seed is None else int(seed)
        sampling = sampling or self.default_sampling
        whole_text = self.config.model_type == "custom_voice" if whole_text is None else whole_text

        def speak(cancelled: threading.Event, stream: TTSStream) -> Iterator[Chunk | None]:
            """The utterance's chunks; the work between two of them is one turn (run, below), and where it yields None
            instead, the turn passes before the work goes on (its frames said so)."""
            model, codec = self.model, None
            for index, segment in enumerate(segments):
                while True:  # once more on the CPU if the GPU runs out of memory, in this stream or another
                    try:
                        if self.model is not model:
                            raise _Moved
                        if codec is None:  # its state is GPU memory too, which may run out as well
                            codec = self._codec_stream(resolved)
                        frames = self._checked(
                            self._frames(segment, resolved, seed ^ (index * 0x9E3779B9 & 0xFFFFFFFF), sampling,
                                         whole_text, cancelled, chunk_frames), seed, index)
                        pending, made = [], 0
                        for codes in frames:
                            if codes is not None:
                                pending.append(codes)
                                if len(pending) < chunk_size(made, chunk_frames):
                                    continue
                                yield self._chunk(codec, pending, index)
                                made += len(pending)
                                pending = []
                            else:
                                yield None  # the turn may pass here
                            if self.model is not model:  # another stream's turn moved the engine meanwhile
                                raise _Moved
                        if pending and not cancelled.is_set():  # a cancelled stream yields nothing more
                            yield self._chunk(codec, pending, index)
                        break
                    except torch.OutOfMemoryError as e:
                        if stream.notice is not None:  # already moved: the CPU cannot do better
                            raise
                        reason = str(e).split("\n")[0]
                    except _Moved:
                        reason = None
                    # outside the except clause, whose traceback holds the GPU state of the failed frames.
                    # The whole segment starts again: its first words are heard twice, none are missed.
                    frames = pending = codes = None
                    if reason is not None:
                        log.warning("the GPU ran out of memory while speaking (%s); moving the speech model to the "
                                    "CPU", reason)
                        self._move_to_cpu()
                        stream.notice = GPUUnavailableError(
                            f"the GPU ran out of memory while speaking ({reason}); Parley speaks on the CPU from now "
                            "on (slower) and started the sentence again")
                    else:  # this stream's GPU state is dropped now: give it back
                        _free_gpu()
                        stream.notice = GPUUnavailableError(
                            "the GPU ran out of memory while speaking another utterance; Parley speaks on the CPU "
                            "from now on (slower) and started this sentence again")
                    model, codec = self.model, None
                if cancelled.is_set():
                    return

        def run(cancelled: threading.Event, stream: TTSStream) -> Iterator[Chunk]:
            """speak()'s chunks, each made in a turn of this engine's: streams iterated at once take turns, each
            due when its listener, hearing from its start on, will have heard all it was given, or as it asks where
            that is past (so streams that fell behind go in turn with one that has just begun, not all before it)."""
            chunks = speak(cancelled, stream)
            given_s = 0.0  # seconds of audio handed out
            try:
                while not cancelled.is_set():  # a cancelled stream yields nothing more, so it asks for no turn
                    with self._turns.turn(max(stream.t_start + given_s, time.perf_counter())):
                        chunk = next(chunks, _ENDED)
                    if chunk is _ENDED:
                        return
                    if chunk is None:
                        continue
                    given_s += len(chunk.pcm) / self.sample_rate_hz
                    yield chunk
            finally:
                chunks.close()  # its frames' cleanup touches nothing another stream uses: no turn needed

        return TTSStream(run, seed, len(segments))

    def synthesize(self, text: str, speaker: str | None = None, language: str | None = "auto", **options) -> np.ndarray:
        """The whole utterance as one float32 array at sample_rate_hz (stream() joined)."""
        chunks = [c.pcm for c in self.stream(text, speaker, language, **options)]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    def _codec_stream(self, voice: Voice):
        """A codec stream for an utterance; for an in-context cloned voice, one that has heard its recording."""
        stream = self.codec.stream()
        if voice.clone is not None and voice.clone.reference_codes is not None:
            stream.continue_from(self._codec_context(voice.clone))
        return stream

    def _codec_context(self, clone: ClonedVoice) -> StreamState | None:
        """The codec's state after an in-context voice's recording (None for an x-vector voice), made once a voice.

        The official decode puts the recording's codes before the new ones, so the codec starts in the voice's
        sound, and cuts their audio off; starting from this state is the same decode, without decoding them again.
        """
        if clone.reference_codes is None:
            return None
        if clone not in self._contexts:
            self._contexts[clone] = self.codec.context(clone.reference_codes.to(self.device))
        return self._contexts[clone]

    def _frames(self, text: str, voice: Voice, seed: int, sampling: SamplingOptions, whole_text: bool,
                cancelled: threading.Event, chunk_frames: int) -> Iterator[torch.Tensor | None]:
        """Codes (16,) of each frame of one segment until EOS, the runaway cap, or cancel; with the megakernel first
        None, where the turn may pass (engine/tts/kernels/batcher.py: streams beginning together share a launch)."""
        talker = self.config.talker
        inputs = self.prompts.build(self.prompts.text_ids(text), voice, whole_text, self.device)
        cap = min(self.max_frames, MIN_FRAMES_CAP + FRAMES_PER_CHAR * len(text))
        sampler = Sampler(sampling, seed, talker.decoder.vocab_size, talker.codec_eos_id, self._suppress)
        state = self.model.begin(inputs.prefill.to(self.dtype), cap)
        kernel = self.model.frame_kernel
        if kernel is not None and kernel.supports(sampling):
            yield from self._launches.run(state, sampler, inputs, cap, cancelled, per_launch=chunk_frames)
            return
        while state.frame < cap and not cancelled.is_set():
            codes = self.model.sample_frame(state, sampler)
            if codes is None:
                return
            yield codes
            if cancelled.is_set():
                return
            self.model.advance(state, codes, inputs.text_input(state.frame))

    def _checked(self, frames: Iterator[torch.Tensor | None], seed: int, segment: int) -> Iterator[torch.Tensor | None]:
        """`frames`, ended before the first frame with a code the codec has no entry for.

        The sampler never picks one, but the codec's table lookup would fail on it and lose the whole utterance:
        the segment ends there instead (what came before it is heard), and the warning holds what reproduces it.
        """
        codebook = self.codec.config.codebook_size
        frame = 0
        try:
            for codes in frames:
                if codes is None:
                    yield None
                    continue
                if bool(((codes < 0) | (codes >= codebook)).any()):
                    log.warning("the speech model picked codes %s in frame %d of segment %d (seed %d), outside the "
                                "codec's 0..%d; that part of the text ends there", codes.tolist(), frame, segment,
                                seed, codebook - 1)
                    return
                yield codes
                frame += 1
        finally:
            frames.close()

    def _chunk(self, codec, frames: list[torch.Tensor], segment: int) -> Chunk:
        codes = torch.stack(frames)
        pcm = codec.decode(codes).float().cpu().numpy()
        return Chunk(pcm=pcm, codes=codes.cpu().numpy(), segment=segment, t_ready=time.perf_counter())


def _free_gpu() -> None:
    """Give the memory of a dropped GPU model back to the driver, for other programs."""
    # a failed stream's or load's GPU state may sit in a reference cycle (frames of its traceback)
    gc.collect()
    if torch.cuda.is_available():
        # cuBLAS keeps a workspace in the caching allocator for every stream it ran on, the side streams
        # the CUDA graphs were captured on too (32 MiB each on an H200), until told to let them go
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()


def _device(name: str | torch.device) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:  # not a device torch knows
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"unknown device '{name}'; choose cpu, cuda or cuda:N")
    return device


def _dtype(device: torch.device, dtype) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if dtype not in names:
            raise ValueError(f"unknown dtype '{dtype}'; choose one of: {', '.join(names)}")
        return names[dtype]
    return dtype


def _precision(device: torch.device, dtype, precision: str) -> Precision:
    """What load_tts runs the model in: on CUDA its dtype alone; on the CPU `precision`, or a dtype named instead."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision '{precision}'; choose one of: {', '.join(PRECISIONS)}")
    if device.type == "cuda":
        if precision != "auto":
            raise ValueError(f"precision '{precision}' is a CPU setting; on CUDA choose a dtype (float32, bfloat16 "
                             "or float16)")
        name = str(_dtype(device, dtype)).removeprefix("torch.")
        return Precision({"bfloat16": "bf16"}.get(name, name), name, name, name)
    if dtype is not None:
        if precision != "auto":
            raise ValueError(f"dtype {dtype} and precision '{precision}' both given; on the CPU give precision alone")
        settings = {torch.float32: "float32", torch.bfloat16: "bf16"}
        if _dtype(device, dtype) not in settings:
            raise ValueError(f"dtype {dtype} does not run on the CPU; choose float32 or bfloat16, or a precision "
                             f"({', '.join(PRECISIONS)})")
        precision = settings[_dtype(device, dtype)]
    return choose_precision(precision)


def load_tts(path: str | Path, device: str = "cpu", dtype: torch.dtype | str | None = None,
             megakernel: bool | None = None, precision: str = "auto") -> TTSEngine:
    """Load a Qwen3-TTS 12 Hz checkpoint folder as published (0.6B or 1.7B; CustomVoice, VoiceDesign or Base).

    A machine without a usable CUDA GPU, or a GPU without room for the model, gets the CPU engine
    (precision "auto") and a logged warning: check the returned engine's `device` and `precision`.

    Args:
        path: the folder (config.json, model.safetensors or shards, tokenizer files, speech_tokenizer/; a Base
            model's weights hold its speaker encoder, and its speech_tokenizer/ the encoder cloning needs).
        device: "cpu" or "cuda" (or "cuda:N").
        dtype: on CUDA bfloat16 (the default), float16 or float32. On the CPU float32 or bfloat16 weights
            throughout, the same as precision "float32" or "bf16".
        megakernel: run decode steps in the CUDA megakernel; None = wherever it can run (CUDA, bf16),
            falling back to PyTorch with a logged warning and the reason in the engine's `megakernel_problem`;
            True = required; False = never. The first load of a kernel version compiles it (about a minute;
            engine.tts.kernels.build.needs_build() says whether it will).
        precision: on the CPU, "auto" (the default) for the fastest this processor does (int8 weights on
            x86 with AVX2; engine.tts.cpu.choose_precision), "int8", "bf16" or "float32" (the reference, as
            the official package computes). The engine's `precision` tells what was chosen. On CUDA, "auto".

    Raises:
        ModelFilesError: a file is missing, truncated, corrupt or does not match config.json; the
            message names the file and ends with how to get the model again. Nothing stays loaded.
        ValueError: a device other than cpu, cuda or cuda:N, an unknown dtype or precision, a precision
            other than "auto" on CUDA, both dtype and precision on the CPU, or "int8" on a CPU without it.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ModelMissingError(f"{folder}: no such model folder")
    device = _device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log.warning("device 'cuda' was asked for, but this machine has no usable CUDA GPU; using the CPU")
        device, dtype = torch.device("cpu"), None
    chosen = _precision(device, dtype, precision)
    try:
        try:
            return _load(folder, device, chosen, megakernel)
        except torch.OutOfMemoryError as e:
            if device.type != "cuda":
                raise
            log.warning("the GPU has no room for the speech model (%s); using the CPU", str(e).split("\n")[0])
            traceback.clear_frames(e.__traceback__)  # the half-loaded model and its graphs' buffers
        _free_gpu()  # outside the except clause: its traceback no longer holds the GPU tensors
        return _load(folder, torch.device("cpu"), choose_precision("auto"), megakernel=False)
    except ModelFilesError as e:
        # the traceback keeps every frame below alive, and with them the weights loaded before the fault
        # (gigabytes on a GPU) for as long as the caller keeps the error: drop those frames' variables
        traceback.clear_frames(e.__traceback__)
        raise ModelFilesError(f"{e}\n{redownload_advice(folder)}").with_traceback(e.__traceback__) from None


def _load(folder: Path, device: torch.device, precision: Precision, megakernel: bool | None) -> TTSEngine:
    """load_tts on a checked folder, device and precision."""
    dtype = getattr(torch, precision.activations)
    config = TTSConfig.from_file(folder / "config.json")
    generation = folder / "generation_config.json"
    defaults = read_json(generation) if generation.exists() else {}
    try:
        sampling = SamplingOptions.from_generation_config(defaults)
    except ValueError as e:
        raise ModelFilesError(f"{generation}: {e}") from None
    # max_new_tokens counts talker tokens as the official generate() does: the last one never becomes a frame
    max_new_tokens = defaults.get("max_new_tokens", 8192)
    if type(max_new_tokens) is not int or max_new_tokens < 2:
        raise ModelFilesError(f"{generation}: max_new_tokens is {max_new_tokens!r}, expected an integer >= 2")
    max_frames = max_new_tokens - 1
    with torch.device("meta"):
        model = Qwen3TTS(config.talker)
    load_weights(model, folder, ignore=("speaker_encoder.",), device=device, dtype=dtype)  # loaded below, for Base
    quantize(model, precision)
    megakernel_problem = None
    if megakernel or (megakernel is None and device.type == "cuda" and dtype == torch.bfloat16):
        from engine.tts.kernels.build import MegakernelUnavailable
        from engine.tts.kernels.megakernel import attach

        try:
            attach(model)
        except MegakernelUnavailable as e:
            if megakernel:
                raise
            log.warning("%s; using the PyTorch engine", e)
            megakernel_problem = str(e)
    if device.type == "cuda":  # the talker's prefill: one CUDA graph per padded prompt length, all captured now
        attach_graphs(model)
    prompts = PromptBuilder(config, load_tokenizer(folder), model.talker)
    codec = load_codec(folder / "speech_tokenizer", device=device, dtype=getattr(torch, precision.codec))
    if device.type == "cpu" and precision.setting != "float32":  # float32 stays the official arithmetic
        speed_up_codec(codec)
    # codebook-0 codes are the talker's ids below its 1024 specials; codes 1..15 are predictor ids
    codebook = config.talker.predictor.vocab_size
    if codec.config.codebook_size != codebook or config.talker.decoder.vocab_size - 1024 != codebook:
        raise ModelFilesError(
            f"{folder / 'speech_tokenizer' / 'config.json'}: codebook_size {codec.config.codebook_size} does not "
            f"match config.json (code predictor vocab_size {codebook}, talker vocab_size "
            f"{config.talker.decoder.vocab_size}); the speech tokenizer belongs to another model"
        )
    if model.frame_kernel is not None:  # the megakernel's extension is built: the codec's elementwise chains run in it
        from engine.tts.kernels.fused import attach_codec

        attach_codec(codec)
    speaker_encoder = speech_encoder = None
    if config.speaker_encoder is not None:
        speaker_encoder = load_speaker_encoder(folder, config.speaker_encoder, device)
        speech_encoder = load_speech_encoder(folder / "speech_tokenizer", device)
        _check_speech_encoder(folder, config, speech_encoder, codec.config.num_quantizers, codebook)
    if device.type == "cuda":  # the codec's stream call: one CUDA graph per chunk length, every length stream()'s
        # default makes captured now (an utterance's tail of 2 or 3 frames would otherwise wait ~140 ms for its capture)
        codec.warm_up(range(1, CHUNK_FRAMES + 1))
    return TTSEngine(folder, config, model, prompts, codec, sampling, max_frames, precision, megakernel_problem,
                     speaker_encoder, speech_encoder)


def _check_speech_encoder(folder: Path, config: TTSConfig, encoder: SpeechEncoder, quantizers: int, codebook: int):
    """A Base model's codec encoder must give the codes its codec decodes, from the audio its speaker encoder hears."""
    path = folder / "speech_tokenizer" / "config.json"
    mimi = encoder.mimi.config
    if encoder.num_quantizers != quantizers or mimi.codebook_size != codebook:
        raise ModelFilesError(f"{path}: the encoder gives {encoder.num_quantizers} codes of {mimi.codebook_size} a "
                              f"frame (encoder_valid_num_quantizers, encoder_config.codebook_size); the decoder takes "
                              f"{quantizers} of {codebook}")
    if encoder.sample_rate_hz != config.speaker_encoder.sample_rate_hz:
        raise ModelFilesError(f"{path}: input_sample_rate is {encoder.sample_rate_hz}, but config.json's "
                              f"speaker_encoder_config.sample_rate is {config.speaker_encoder.sample_rate_hz}")
