"""The speaking style on the real engine: a generated 1.7B-shaped checkpoint (tiny-1.7b) takes it, and the
style set in the settings reaches the TTS prompt of replies and typed speech, changed live; the 0.6B-shaped
one takes none and a stored style is left out rather than failing the load."""

from dataclasses import replace

import pytest

from engine.tts.prompt import PromptBuilder
from engine.tts.testing import write_checkpoint
from tests.app.test_worker import Harness, base_config  # noqa: F401  (a fixture)
from tests.conftest import copy_checkpoint

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (see DESIGN.md section 6)")


@pytest.fixture(scope="module")
def checkpoint_17b(tmp_path_factory):
    """tiny-1.7b, capped at 6 frames a segment (max_new_tokens=7) for quick streams."""
    folder = write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny17", "tiny-1.7b", seed=1)
    return copy_checkpoint(folder, tmp_path_factory.mktemp("ckpt") / "tiny17-short", max_new_tokens=7)


@pytest.fixture
def prompts(monkeypatch):
    """The instruct of every TTS prompt built from now on (the real PromptBuilder.build, recorded)."""
    seen = []
    build = PromptBuilder.build

    def recorded(self, text_ids, voice, whole_text, device):
        seen.append(voice.instruct)
        return build(self, text_ids, voice, whole_text, device)

    monkeypatch.setattr(PromptBuilder, "build", recorded)
    return seen


def test_a_style_reaches_the_prompt_of_replies_and_typed_speech_and_changes_live(qtbot, base_config, checkpoint_17b,
                                                                                 prompts, tmp_path):
    """tiny-1.7b: ready() says it takes a style; speak() and send() build their prompts with it, and a new
    style from apply() is used by the next turn without reloading a model."""
    harness = Harness(qtbot)
    try:
        # no Whisper (a missing folder): typed turns only, which is all this needs, and a quicker load
        config = replace(base_config, tts_model=str(checkpoint_17b), style="cheerful", stt_model=str(tmp_path / "none"))
        (info,) = harness.emitted(harness.worker.ready, harness.requests.load, config)
        assert (info.style_kind, info.style_unsupported) == ("style", "")

        turn = harness.worker.turn_finished
        (said,) = harness.emitted(turn, harness.requests.send, "Good morning.")
        assert said.reply_text.strip() and prompts and set(prompts) == {"cheerful"}

        loaded = len(harness.progress)
        prompts.clear()
        (info,) = harness.emitted(harness.worker.ready, harness.requests.apply, replace(config, style="slowly"))
        assert len(harness.progress) == loaded  # applied live: no loading step ran
        harness.emitted(turn, harness.requests.speak, "Hello there.")
        assert prompts and set(prompts) == {"slowly"}
    finally:
        harness.close()


def test_a_model_without_styles_ignores_a_stored_one(qtbot, base_config, prompts, tmp_path):
    """The 0.6B-shaped checkpoint: loading with a stored style works, ready() says why there is none, and the
    prompts carry no instruct."""
    harness = Harness(qtbot)
    try:
        config = replace(base_config, style="cheerful", stt_model=str(tmp_path / "none"))
        (info,) = harness.emitted(harness.worker.ready, harness.requests.load, config)
        assert info.style_kind is None and "0.6B" in info.style_unsupported
        harness.emitted(harness.worker.turn_finished, harness.requests.speak, "Hello there.")
        assert prompts and set(prompts) == {None}
    finally:
        harness.close()
