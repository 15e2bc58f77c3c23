"""The LLM side of Parley: a llama-cpp-python chat model and the clause splitter that feeds the TTS.

Importing this package does not import llama_cpp; ChatModel does, when it loads a model.
"""

from engine.llm.chat import ChatModel, ChatOptions, Reply, bundled_model_path
from engine.llm.clauses import ClauseOptions, ClauseSplitter, iter_clauses, speakable_text, split_clauses

__all__ = [
    "ChatModel", "ChatOptions", "ClauseOptions", "ClauseSplitter", "Reply", "bundled_model_path",
    "iter_clauses", "speakable_text", "split_clauses",
]
