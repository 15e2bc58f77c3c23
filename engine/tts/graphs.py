"""CUDA graphs captured on first use, one per shape, as torch.cuda.graphs documents: the recipe that the
codec stream (codec.py) and the talker prefill (prefill.py) share.

A capture runs on a side stream: three eager warm-up runs first (cuBLAS and cuDNN handles, workspaces,
plans and lazily built tensors), then the capture itself, which does not execute the work. All graphs of
one GraphSet share a memory pool: they never replay concurrently, so the caller copies each replay's
outputs before the next replay can overwrite them. A graph keeps the math settings of its capture (TF32
on or off). capture_error_mode "thread_local" lets other threads (Whisper, the LLM) keep using the GPU
while a capture is under way.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

_WARM_UP_RUNS = 3


class GraphSet:
    """CUDA graphs of one device, keyed by shape (a chunk length, a bucket)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._stream = torch.cuda.Stream(device)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, Any]] = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self._graphs

    def __getitem__(self, key: Hashable) -> tuple[torch.cuda.CUDAGraph, Any]:
        """(graph, what run() returned when it was captured: its static outputs)."""
        return self._graphs[key]

    @property
    def captured(self) -> list:
        """The keys whose graphs exist, sorted."""
        return sorted(self._graphs)

    def capture(self, key: Hashable, run: Callable[[], Any], warm_up: Callable[[], Any] | None = None
                ) -> tuple[torch.cuda.CUDAGraph, Any]:
        """Capture run() as the graph for `key` (replacing none: the key must be new) and return self[key].

        run() must read and write only tensors that outlive the graph; warm_up() (run() when None) is
        what the warm-up runs execute, for a run() whose side effects must not happen before the replay.
        """
        if key in self._graphs:
            raise KeyError(f"a graph for {key!r} exists already")
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)  # the warm-up reads inputs written on `current`
        with torch.cuda.device(self.device):
            with torch.cuda.stream(self._stream):
                for _ in range(_WARM_UP_RUNS):
                    (warm_up or run)()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"):
                outputs = run()
        current.wait_stream(self._stream)
        self._graphs[key] = graph, outputs
        return self._graphs[key]
