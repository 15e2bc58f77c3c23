"""engine.catalogue: what Parley recommends downloading, sized to the computer."""

from engine.catalogue import (CLONING, OFFERS, QWEN_1_5B, QWEN_7B, SPEECH, WHISPER_SMALL, Machine, recommended,
                              this_machine)

GB = 1024**3


def test_a_computer_without_a_large_gpu_gets_the_cpu_fast_models():
    """No GPU (or a small one): the 1.5B language model, and no Whisper download (the bundled base is the fit)."""
    for machine in (Machine(16 * GB, 0), Machine(64 * GB, 4 * GB)):
        assert recommended(machine) == {"tts": SPEECH, "stt": None, "llm": QWEN_1_5B}


def test_a_gpu_with_room_gets_the_larger_language_and_hearing_models():
    assert recommended(Machine(32 * GB, 24 * GB)) == {"tts": SPEECH, "stt": WHISPER_SMALL, "llm": QWEN_7B}


def test_the_voice_cloning_model_is_offered_but_not_recommended_to_everyone():
    """The Base model is on offer (its kind "clone") and none of the recommended downloads: only those who clone a
    voice want it."""
    assert CLONING in OFFERS and CLONING.repo_id == "Qwen/Qwen3-TTS-12Hz-0.6B-Base" and CLONING.size == "about 2 GB"
    assert "clones a voice from a few seconds of speech" in CLONING.why
    for machine in (Machine(16 * GB, 0), Machine(32 * GB, 24 * GB)):
        assert CLONING not in recommended(machine).values()


def test_every_offer_names_its_size_licence_and_where_it_lands(monkeypatch, tmp_path):
    monkeypatch.setenv("PARLEY_MODELS", str(tmp_path))
    for offer in OFFERS:
        assert offer.size.startswith("about ") and offer.licence and offer.why
        assert offer.download_folder() == tmp_path / offer.repo_id.split("/")[1]
    assert QWEN_7B.downloaded_path() == tmp_path / "Qwen2.5-7B-Instruct-GGUF" / "Qwen2.5-7B-Instruct-Q4_K_M.gguf"


def test_this_machine_reads_its_memory_and_a_gpu_only_where_nvidia_smi_says(monkeypatch, tmp_path):
    """The memory is the machine's; without nvidia-smi on PATH there is no GPU; with one, its figure in MiB."""
    this_machine.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    try:
        machine = this_machine()
        assert machine.memory > GB and machine.gpu_memory == 0
        smi = tmp_path / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho 81559\necho 24576\n")
        smi.chmod(0o755)
        this_machine.cache_clear()
        assert this_machine().gpu_memory == 81559 * 1024**2
    finally:
        this_machine.cache_clear()
