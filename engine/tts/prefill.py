"""The talker's prefill padded to a few fixed lengths, so that on CUDA each length replays one captured
CUDA graph instead of ~400 eager launches. Equals Qwen3TTS.begin (engine/tts/model.py) up to matmul rounding.

`PaddedPrefill` is the whole method in plain PyTorch, on any device: the prompt (T, hidden) goes into a
static buffer of bucket length B >= T (rows T..B-1 zero), the unchanged DecoderStack runs on all B rows
into a static KV cache, the final-normed row T-1 is picked by a device-side index and the codec head
runs on it; then the first T positions of K/V are copied into the utterance's own cache. Causal
attention makes rows 0..T-1 and their K/V independent of the padded rows, and the padded rows' K/V
never reach the utterance: only positions 0..T-1 are copied, and a decode step at position p writes
K/V at p before it attends over 0..p (model.py Attention.forward, csrc/megakernel decoder_step.cuh
attention_head), so nothing beyond the filled positions is read. `PrefillGraphs` captures that same
`run(bucket)` once per bucket and replays it; `attach_graphs` puts it on a CUDA model.

Buckets are powers of two, 16..512. Up to ~200 rows a bf16 prefill is bound by reading each weight once
(a GEMM of M rows does ~M flops a weight byte; an H200 needs ~200 to be compute-bound), so padding a
prompt to up to twice its length is nearly free there, and a doubling ladder caps the waste above at 2x
with only six graphs. 512 rows hold a full 400-character segment (stream.py SEGMENT_CHARS) at up to one
token a character (English is ~0.25, CJK and digits ~1) plus the ~11 rows of role, codec tags and tail.
Longer prompts (rare scripts at several byte tokens a character, long voice descriptions) run eagerly.
"""

from __future__ import annotations

import torch

from engine.tts.graphs import GraphSet
from engine.tts.model import FrameState, Qwen3TTS

BUCKETS = (16, 32, 64, 128, 256, 512)  # padded prompt lengths (rows), see above


class PaddedPrefill:
    """Qwen3TTS.begin on static buffers of a few padded lengths: what PrefillGraphs captures, run eagerly.

    One utterance begins at a time: the buffers are shared (a TTSEngine's streams begin theirs in their turns,
    engine/tts/turns.py), and begin() leaves nothing in them that the utterance reads later.
    """

    def __init__(self, model: Qwen3TTS, buckets: tuple[int, ...] = BUCKETS):
        # a one-row run would be a decode step (the megakernel's, where attached), not a prefill
        if not buckets or min(buckets) < 2:
            raise ValueError(f"buckets must be lengths of 2 rows or more, got {buckets}")
        self.talker = model.talker
        self.buckets = tuple(sorted(set(buckets)))
        weight = self.talker.codec_head.weight
        stack = self.talker.model
        with torch.inference_mode():
            # (largest bucket, hidden): the prompt's rows, then zeros up to the bucket's length
            self.x = torch.zeros(self.buckets[-1], stack.cfg.hidden_size, device=weight.device, dtype=weight.dtype)
            self.last = torch.zeros(1, dtype=torch.int64, device=weight.device)  # (1,) row T-1, set per prompt
            # K/V of the padded rows; one cache serves every bucket, as only one runs at a time
            self.cache = stack.new_cache(self.buckets[-1], self.x)

    def fits(self, prompt: torch.Tensor) -> bool:
        """Whether `prompt` (T, hidden) has a bucket here: 1 <= T <= the largest, and the buffers' dtype and device."""
        return (1 <= prompt.shape[0] <= self.buckets[-1] and prompt.dtype == self.x.dtype
                and prompt.device == self.x.device)

    def bucket(self, length: int) -> int:
        """The smallest bucket holding `length` rows."""
        return next(b for b in self.buckets if b >= length)

    @torch.inference_mode()
    def begin(self, prompt: torch.Tensor, max_frames: int) -> FrameState:
        """Qwen3TTS.begin for a prompt that fits(): prefill (T, hidden), room for max_frames more."""
        T = prompt.shape[0]
        B = self.bucket(T)
        self.x[:T].copy_(prompt)
        self.x[T:B].zero_()  # any finite rows would do; zeros keep every run's pad the same
        self.last.fill_(T - 1)
        hidden, logits = self.run(B)
        stack = self.talker.model
        cache = stack.new_cache(T + max_frames, prompt)
        cache.k[:, :, :T].copy_(self.cache.k[:, :, :T])
        cache.v[:, :, :T].copy_(self.cache.v[:, :, :T])
        cache.length = T
        # copies: a graph's outputs are overwritten by the next replay that shares its memory pool
        return FrameState(cache, hidden.clone(), logits.clone())

    def run(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The talker on the first `bucket` rows of the static input -> (hidden (H,), logits (V,)) of row `last`.

        Reads and writes only the static buffers (x, last, cache), so a CUDA graph can capture it.
        """
        self.cache.length = 0
        normed = self.talker.model(self.x[:bucket], self.cache)  # (bucket, H)
        hidden = normed.index_select(0, self.last)[0]  # (H,)
        return hidden, self.talker.codec_head(hidden)


class PrefillGraphs(PaddedPrefill):
    """PaddedPrefill with run(bucket) captured as a CUDA graph on a bucket's first use, replayed after
    (engine/tts/graphs.py); begin() copies a replay's outputs, as the buckets share one memory pool."""

    def __init__(self, model: Qwen3TTS, buckets: tuple[int, ...] = BUCKETS):
        super().__init__(model, buckets)
        if self.x.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, it is on {self.x.device}")
        # bucket -> (graph, (hidden, logits))
        self._graphs = GraphSet(self.x.device)

    @property
    def captured(self) -> list[int]:
        """The buckets whose graphs exist, smallest first."""
        return self._graphs.captured

    @torch.inference_mode()
    def warm_up(self, max_rows: int | None = None) -> None:
        """Capture every bucket up to `max_rows` rows (None: all) now, instead of on its first prompt."""
        for bucket in self.buckets:
            if max_rows is None or bucket <= max_rows:
                self._graph(bucket)

    def run(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        graph, outputs = self._graph(bucket)
        graph.replay()
        return outputs

    def _graph(self, bucket: int):
        if bucket in self._graphs:
            return self._graphs[bucket]
        return self._graphs.capture(bucket, lambda: PaddedPrefill.run(self, bucket))


def attach_graphs(model: Qwen3TTS, buckets: tuple[int, ...] = BUCKETS,
                  warm_up_rows: int | None = None) -> PrefillGraphs:
    """Make model.begin() replay a CUDA graph per bucket (prompts longer than the largest stay eager), and
    capture the buckets up to `warm_up_rows` rows now (None: all of them; 0: none, each on first use).

    Raises:
        ValueError: the model is not on a CUDA device.
    """
    graphs = PrefillGraphs(model, buckets)
    graphs.warm_up(warm_up_rows)
    model.padded_prefill = graphs
    return graphs
