"""From text to the talker's inputs: clean and split the text, tokenize it with Qwen's tokenizer, and
assemble the CustomVoice / VoiceDesign / Base (cloned voice) prompt exactly as qwen_tts's
Qwen3TTSForConditionalGeneration.generate and its generate_icl_prompt.

Each talker input is a sum of a text-track vector (projected text token, or tts_pad) and a codec-track
vector (a codec special id's embedding, a cloned voice's speaker embedding, or a frame's 16 summed codebook
embeddings: the previous frame's while speaking, a cloned voice's recording's in its prompt).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import InputTextError, ModelFilesError
from engine.text import CJK_CLAUSE_MARKS, CJK_SENTENCE_ENDS, CLAUSE_MARKS, SENTENCE_ENDS
from engine.tts.clone import ClonedVoice
from engine.tts.config import TTSConfig
from engine.tts.model import Talker

# Sentence ends (engine/text.py's: a space after them, or CJK's, none) and line ends, then clause marks for
# over-long sentences
_SENTENCE_END = re.compile(rf"(?<=[{re.escape(SENTENCE_ENDS + CJK_SENTENCE_ENDS)}])\s+|(?<=[{CJK_SENTENCE_ENDS}])|\n+")
_CLAUSE_END = re.compile(rf"(?<=[{re.escape(CLAUSE_MARKS + CJK_CLAUSE_MARKS)}])\s*")
_VOICES_KEPT = 8  # PromptBuilder._voice_rows


def split_text(text: str, max_chars: int) -> list[str]:
    """Split cleaned text (engine.text.clean_text) into segments of at most max_chars, at sentence ends where possible.

    Sentences are packed together up to max_chars; a longer sentence is cut at clause marks, then
    at spaces, and only then mid-word, so no segment exceeds max_chars.
    """
    pieces: list[str] = []
    for sentence in filter(None, (s.strip() for s in _SENTENCE_END.split(text))):
        if len(sentence) <= max_chars:
            pieces.append(sentence)
            continue
        for clause in filter(None, (c.strip() for c in _CLAUSE_END.split(sentence))):
            while len(clause) > max_chars:
                cut = clause.rfind(" ", 0, max_chars + 1)
                cut = cut if cut > max_chars // 2 else max_chars
                pieces.append(clause[:cut].strip())
                clause = clause[cut:].strip()
            if clause:
                pieces.append(clause)
    segments: list[str] = []
    for piece in pieces:
        if segments and len(segments[-1]) + 1 + len(piece) <= max_chars:
            segments[-1] += " " + piece
        else:
            segments.append(piece)
    return segments


def load_tokenizer(folder: Path):
    """Qwen's own tokenizer from the checkpoint folder (vocab.json + merges.txt, or tokenizer.json)."""
    from transformers import AutoTokenizer  # heavy import, only when a model is loaded

    # without tokenizer.json, AutoTokenizer needs both vocab.json and merges.txt (a lone vocab.json fails obscurely)
    missing = [name for name in ("vocab.json", "merges.txt") if not (folder / name).exists()]
    if missing and not (folder / "tokenizer.json").exists():
        raise ModelFilesError(f"{folder}: no text tokenizer ({' and '.join(missing)} missing; the checkpoint needs "
                              "vocab.json + merges.txt or tokenizer.json)")
    try:
        # fix_mistral_regex=False: transformers 4.57.3 would otherwise swap in Mistral's pre-tokenizer regex
        # for large vocabularies whose config.json says 4.57.3, which the Qwen checkpoints do
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, fix_mistral_regex=False)
    except Exception as e:  # transformers raises many types for broken files
        raise ModelFilesError(f"{folder}: the text tokenizer files cannot be loaded ({e})") from None


@dataclass(frozen=True)
class Voice:
    """Who speaks and how: resolved against the checkpoint's config."""

    speaker: str | None  # lower-case speaker name (CustomVoice) or None (VoiceDesign, Base)
    language: str  # lower-case language name or "auto"
    instruct: str | None = None  # speaking style / voice description, where the model takes one
    clone: ClonedVoice | None = None  # the voice a Base model speaks in


def resolve_voice(cfg: TTSConfig, speaker: str | None, language: str | None, instruct: str | None,
                  clone: ClonedVoice | None = None) -> Voice:
    """Check speaker, language, style and cloned voice against a checkpoint's config; names are case-insensitive.
    `cfg` may also be a speech server's ServedModel (engine/speech_client.py): its model_type, model_size, speakers
    and languages are what this reads, but for a cloned voice's width.

    Raises:
        InputTextError: an unknown speaker or language (listing the valid ones), a style the model does not
            take, a Base model without a cloned voice, or a cloned voice for another model.
    """
    language = (language or "auto").lower()
    if language not in cfg.languages:
        raise InputTextError(f"unknown language '{language}'; this model has: {', '.join(cfg.languages)}")
    if cfg.model_type == "base":
        if speaker or instruct:
            raise InputTextError("a Base model has no built-in speakers and takes no speaking style: it speaks in a "
                                 "voice cloned from a recording (voice=...)")
        if clone is None:
            raise InputTextError("a Base model speaks in a cloned voice: clone one from a recording with "
                                 "clone_voice(), or load a saved one with load_voice(), and pass it as voice=...")
        hidden = cfg.talker.decoder.hidden_size
        if clone.model_size != cfg.model_size or clone.embedding.shape != (hidden,):
            raise InputTextError(f"this voice was cloned with another model (a {clone.model_size or 'unknown'} Base "
                                 f"model, a {clone.embedding.shape[0]}-wide embedding; this is a {cfg.model_size} one, "
                                 f"{hidden} wide): clone it again from its recording with this model")
        return Voice(None, language, None, clone)
    if clone is not None:
        raise InputTextError(f"a cloned voice needs a Base model (Qwen3-TTS-12Hz-*-Base); this is a "
                             f"{cfg.model_type} model")
    if cfg.model_type == "custom_voice":
        if not speaker:
            raise InputTextError(f"choose a speaker; this model has: {', '.join(cfg.speakers)}")
        if speaker.lower() not in cfg.speakers:
            raise InputTextError(f"unknown speaker '{speaker}'; this model has: {', '.join(cfg.speakers)}")
        if instruct and cfg.model_size == "0b6":
            raise InputTextError("this 0.6B model takes no speaking style; the 1.7B CustomVoice model does")
        return Voice(speaker.lower(), language, instruct or None)
    if cfg.model_type == "voice_design":
        if speaker:
            raise InputTextError("a VoiceDesign model has no built-in speakers: describe the voice instead")
        if not instruct:
            raise InputTextError("a VoiceDesign model needs a voice description (instruct)")
        return Voice(None, language, instruct)
    raise InputTextError(
        f"'{cfg.model_type}' models (voice cloning) are not supported yet; use a CustomVoice or VoiceDesign checkpoint"
    )


@dataclass(frozen=True)
class TalkerInputs:
    """What the talker is fed for one segment: a prefill, then one text-track row per frame."""

    prefill: torch.Tensor  # (T, hidden)
    track: torch.Tensor  # (N, hidden): the text-track input after frame i is track[i] ...
    pad: torch.Tensor  # (hidden,): ... and tts_pad once the track is used up

    def text_input(self, frame: int) -> torch.Tensor:
        return self.track[frame] if frame < self.track.shape[0] else self.pad

    def text_inputs(self, start: int, n: int) -> torch.Tensor:
        """text_input(start .. start + n - 1) as one contiguous float32 (n, hidden) tensor."""
        rows = self.track[start:start + n]
        if rows.shape[0] < n:
            rows = torch.cat((rows, self.pad.expand(n - rows.shape[0], -1)))
        return rows.float().contiguous()


class PromptBuilder:
    """Builds the talker's prefill inputs and its text track for one segment of text."""

    def __init__(self, cfg: TTSConfig, tokenizer, talker: Talker):
        self.cfg, self.tokenizer, self.talker = cfg, tokenizer, talker
        self.role_ids = self._ids("<|im_start|>assistant\n", specials=True)  # im_start, "assistant", "\n"
        self.tail_ids = self._ids("<|im_end|>\n<|im_start|>assistant\n", specials=True)
        if len(self.role_ids) != 3 or self.role_ids[0] != cfg.im_start_id or self.tail_ids[0] != cfg.im_end_id:
            raise ModelFilesError(
                f"the checkpoint's tokenizer does not match its config: '<|im_start|>assistant\\n' gives "
                f"{self.role_ids}, config.json says im_start_token_id={cfg.im_start_id}"
            )
        self._voices: dict[tuple[Voice, torch.device], tuple[torch.Tensor, ...]] = {}  # see _voice_rows

    def _ids(self, text: str, specials: bool) -> list[int]:
        # User text never turns into control tokens: "<|im_end|>" typed by a user stays plain text.
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=not specials)["input_ids"]

    def text_ids(self, text: str) -> list[int]:
        """Token ids of cleaned text, as the official prompt holds them between role and tail."""
        return self._ids(text, specials=False)

    def _codec_prefix(self, voice: Voice) -> list[int | None]:
        """Codec-track ids of the prefill: think tags (+ language), speaker, pad, bos. None marks a cloned voice's
        speaker embedding, which stands where a speaker's id embedding would."""
        t = self.cfg.talker
        language_id = None if voice.language == "auto" else t.language_ids[voice.language]
        if voice.speaker and voice.language in ("chinese", "auto") and voice.speaker in t.speaker_dialects:
            language_id = t.language_ids[t.speaker_dialects[voice.speaker]]  # a dialect speaker's own tongue
        if language_id is None:
            tags = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
        else:
            tags = [t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id]
        speaker = [t.speaker_ids[voice.speaker]] if voice.speaker else [None] if voice.clone else []
        return tags + speaker + [t.codec_pad_id, t.codec_bos_id]

    @torch.inference_mode()
    def build(self, text_ids: list[int], voice: Voice, whole_text: bool, device) -> TalkerInputs:
        """The talker's inputs for one segment of text (token ids, cleaned and non-empty).

        whole_text=True is the official non_streaming_mode (the CustomVoice default): all text in the
        prefill, the text track all tts_pad. False feeds the text one token per frame after the first.
        """
        head, codec_bos, codec_pad, eos, pad, ends, reference = self._voice_rows(voice, torch.device(device))
        text = self.talker.text_embed(torch.tensor(text_ids, dtype=torch.long, device=device))
        if reference is not None:
            return self._in_context(head, text, reference, codec_pad, eos, pad, whole_text)
        if whole_text:
            body = (text + codec_pad, ends)
            track = text[:0]
        else:
            body = ((text[0] + codec_bos)[None],)
            track = torch.cat((text[1:], eos[None]))
        return TalkerInputs(torch.cat((head, *body)), track, pad)

    @staticmethod
    def _in_context(head, text, reference, codec_pad, eos, pad, whole_text: bool) -> TalkerInputs:
        """An in-context cloned voice's inputs (generate_icl_prompt): its recording's transcript, then the text, then
        tts_eos on the text track; codec bos, then the recording's frames on the codec track."""
        reference_text, frames = reference  # (R, hidden) transcript rows; (F + 1, hidden) codec bos + frames
        text = torch.cat((reference_text, text, eos[None]))
        if whole_text:  # the text over codec pads, then the frames over tts_pad
            return TalkerInputs(torch.cat((head, text + codec_pad, frames + pad)), text[:0], pad)
        # the two tracks side by side: the longer text goes on one token a frame, a shorter one is padded
        F = frames.shape[0]
        if text.shape[0] > F:
            return TalkerInputs(torch.cat((head, text[:F] + frames)), text[F:], pad)
        text = torch.cat((text, pad.expand(F - text.shape[0], -1)))
        return TalkerInputs(torch.cat((head, text + frames)), text[:0], pad)

    def _voice_rows(self, voice: Voice, device: torch.device) -> tuple:
        """What a prompt holds besides its text, which depends on the voice alone: the rows before the text
        (instruct, role, codec tags, speaker), the codec bos and pad rows, the projected tts_eos and tts_pad, the
        two rows after a whole text (tts_eos + codec pad, tts_pad + codec bos), and an in-context cloned voice's
        (transcript rows, codec bos + recording frame rows), else None. Made once per voice (the latest few are
        kept), as each costs a dozen launches on a GPU."""
        key = (voice, device)
        if key not in self._voices:
            cfg, talker = self.cfg, self.talker

            def ids(values):
                return torch.tensor(values, dtype=torch.long, device=device)

            bos, eos, pad = talker.text_embed(ids([cfg.tts_bos_id, cfg.tts_eos_id, cfg.tts_pad_id])).unbind(0)
            prefix = self._codec_prefix(voice)
            codec = talker.codec_embed(ids([0 if i is None else i for i in prefix]))  # (C, hidden)
            if None in prefix:
                codec[prefix.index(None)] = voice.clone.embedding.to(device, codec.dtype)
            parts = []
            if voice.instruct:
                parts.append(talker.text_embed(ids(self._instruct_ids(voice.instruct))))
            parts.append(talker.text_embed(ids(self.role_ids)))
            # tts_pad under each codec tag, tts_bos under the last but one (pad); codec bos is held back
            C = codec.shape[0]
            parts.append(torch.cat((pad.expand(C - 2, -1), bos[None])) + codec[:-1])
            codec_pad = talker.codec_embed(ids([cfg.talker.codec_pad_id]))
            if len(self._voices) >= _VOICES_KEPT:  # VoiceDesign descriptions are free text: keep only the latest
                del self._voices[next(iter(self._voices))]
            ends = torch.cat((eos + codec_pad, (pad + codec[-1])[None]))
            reference = None
            if voice.clone is not None and voice.clone.reference_codes is not None:
                codes = voice.clone.reference_codes.to(device)  # (F, 16)
                frames = torch.cat((codec[-1:], talker.frame_embedding(codes.T)))
                reference = talker.text_embed(ids(self.text_ids(voice.clone.reference_text))), frames
            self._voices[key] = torch.cat(parts), codec[-1], codec_pad, eos, pad, ends, reference
        return self._voices[key]

    def _instruct_ids(self, instruct: str) -> list[int]:
        user = self._ids("<|im_start|>user\n", specials=True)
        end = self._ids("<|im_end|>\n", specials=True)
        return user + self.text_ids(instruct) + end
