"""How long the LLM takes to start each reply of a long conversation, the reply that first outgrows its context, and
the first reply of that conversation reopened.

Method: one ChatModel (the bundled SmolLM2-135M unless --model) talks with scripted questions, greedy, each reply
stopped after --reply-tokens tokens (its text so far joins the history, as after a barge-in). Each turn's TTFT is
printed; at a turn whose prompt drops old turns (a history trim), a second ChatModel given the same history reads
the same prompt from an empty cache: the baseline, what the trim's turn cost while the kept history was read again.
Then the second model reopens the whole conversation twice and answers one more question: from an empty cache (the
baseline) and after ChatModel.read_ahead() has read the prompt's start, as the voice loop does while it idles.

    python bench/llm_history.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QUESTIONS = ["What time is it in London?", "Tell me a fact about the moon.", "How do I boil an egg?",
             "What's a good name for a cat?", "Can you recommend a book?", "Why is the sky blue?"]


def reply(chat, text: str, tokens: int):
    """The reply to `text`, stopped after `tokens` tokens."""
    answer = chat.stream_reply(text)
    with answer:
        for count, _ in enumerate(answer, 1):
            if count >= tokens:
                break
    return answer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a GGUF chat model (default: the bundled SmolLM2-135M)")
    parser.add_argument("--turns", type=int, default=70)
    parser.add_argument("--reply-tokens", type=int, default=60)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    from engine.llm.chat import ChatModel, ChatOptions, bundled_model_path

    path = args.model or bundled_model_path()
    options = ChatOptions(n_ctx=args.n_ctx, n_threads=args.threads, temperature=0.0)
    chat = ChatModel(path, options)
    fresh = ChatModel(path, options)
    usual, trims, sent_first = [], [], None
    for turn in range(args.turns):
        text = f"{QUESTIONS[turn % len(QUESTIONS)]} (turn {turn})"
        history = chat.history
        first = chat.prompt_messages(text)[1]  # where a trim happens, as in stream_reply
        if turn >= 2 and first != sent_first:
            fresh.history = history
            baseline = reply(fresh, text, args.reply_tokens).ttft_ms
            ttft = reply(chat, text, args.reply_tokens).ttft_ms
            trims.append((turn, ttft, baseline))
            print(f"turn {turn}: TTFT {ttft:.0f} ms (history trimmed; read from an empty cache: {baseline:.0f} ms)")
        else:
            usual.append(reply(chat, text, args.reply_tokens).ttft_ms)
            print(f"turn {turn}: TTFT {usual[-1]:.0f} ms")
        sent_first = first
    reopened = []
    for read_ahead in (False, True):
        fresh.clear_history()
        reply(fresh, "Hello.", 1)  # another conversation in the cache, as before one is reopened
        fresh.history = chat.history
        while read_ahead and fresh.read_ahead():
            pass
        reopened.append(reply(fresh, "Where were we?", args.reply_tokens).ttft_ms)
    print(f"turns without a trim: TTFT p50 {statistics.median(usual):.0f} ms, max {max(usual):.0f} ms")
    for turn, ttft, baseline in trims:
        print(f"trim at turn {turn}: TTFT {ttft:.0f} ms, the same prompt read whole {baseline:.0f} ms")
    print(f"the conversation reopened: TTFT {reopened[0]:.0f} ms from an empty cache, {reopened[1]:.0f} ms read ahead")
    return 0


if __name__ == "__main__":
    sys.exit(main())
