def __getattr__(name):
    raise NotImplementedError(f"torchaudio stub: {name} is only used by qwen-tts's 25 Hz tokenizer")
