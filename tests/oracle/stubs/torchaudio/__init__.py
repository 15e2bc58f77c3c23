"""Test-only stand-in for torchaudio.

PyPI's torchaudio is CUDA-linked and fails to import beside the CPU build of torch; qwen-tts imports
it only for its 25 Hz tokenizer, which Parley never uses. Anything that reaches for it fails loudly.
"""
