"""Utterances spoken at once share the frame kernel's launches: whichever stream needs frames launches the kernel for
every utterance under way that will soon need more too (BatchKernel), and keeps their frames until their streams ask.

Each utterance gets the very codes its launches alone would give it (BatchKernel's promise), so sharing changes when
frames are made, never which. A launch holds the stream that asked for its frames to its own pace: the others in it
make as many frames as it does, at most, so a stream that joins still has its first frame after a one-frame launch.
Streams that begin together make their first frames together: each hands its turn on once its prompt is in (run()
yields None there), and a launch takes the utterances with the fewest frames first.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from engine.tts.kernels.megakernel import BatchKernel, FrameKernel, KernelRun
from engine.tts.model import FrameState, Qwen3TTS
from engine.tts.prompt import TalkerInputs
from engine.tts.sampling import Sampler

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Utterance:
    run: KernelRun
    per_launch: int
    cancelled: threading.Event
    ready: deque[torch.Tensor] = field(default_factory=deque)  # frames made, not yet asked for

    def wants(self) -> int:
        return self.run.wants(self.per_launch)


class Batcher:
    """The frame kernels' launches for the utterances of one engine. run() is iterated in the engine's turns, so one
    launch is made at a time; its utterance may end from any thread."""

    def __init__(self, model: Qwen3TTS):
        self._single: FrameKernel = model.frame_kernel
        # a kernel a batch size, the smallest that holds a launch's utterances taking it: every one of its slots
        # costs a launch about as much as an utterance does
        self._batches: list[BatchKernel] = []
        for size in BatchKernel.SIZES:
            try:
                self._batches.append(BatchKernel(model, size))
            except RuntimeError as e:  # a GPU whose SMs cannot hold this size (its scratch grows with it)
                log.warning("a launch of the speech kernel makes frames for %d utterances at most: %s",
                            self._batches[-1].streams if self._batches else 1, e)
                break
        self._lock = threading.Lock()  # the utterances under way; held through a launch, which reads their state
        self._under_way: list[_Utterance] = []
        self.shared_launches = 0  # launches that made frames for more than one utterance

    def run(self, state: FrameState, sampler: Sampler, inputs: TalkerInputs, cap: int, cancelled: threading.Event,
            per_launch: int = 1) -> Iterator[torch.Tensor | None]:
        """As FrameKernel.run: codes (16,) of each frame from `state` (just after begin()) until EOS, `cap` frames,
        or cancel; some made in launches of other utterances. First None: the utterance is under way, and its turn
        may pass to the streams beginning with it, so that its first launch makes their first frames too."""
        me = _Utterance(KernelRun.start(state, sampler, inputs, cap), per_launch, cancelled)
        with self._lock:
            self._under_way.append(me)
        try:
            yield None
            while not cancelled.is_set():
                if not me.ready:
                    if me.run.ended:
                        return
                    self._launch(me)
                while me.ready and not cancelled.is_set():
                    yield me.ready.popleft()
        finally:
            with self._lock:  # waits for a launch of another utterance that may be writing this one's state
                self._under_way.remove(me)

    def _launch(self, me: _Utterance) -> None:
        """One launch for `me` and, where the batch kernels are, for as many other utterances as the largest takes
        that have fewer frames ready than they take a launch, those that have made the fewest first (one waiting for
        its first frame before the others' next ones), each making at most as many frames as `me`."""
        frames = me.wants()
        with self._lock:
            others = sorted((u for u in self._under_way if u is not me and not u.run.ended
                             and not u.cancelled.is_set() and len(u.ready) < u.per_launch),
                            key=lambda u: u.run.state.frame)
            if not self._batches or not others:
                me.ready.extend(self._single.launch(me.run, frames))
                return
            together = [me, *others[: self._batches[-1].streams - 1]]
            kernel = next(k for k in self._batches if k.streams >= len(together))
            made = kernel.launch([u.run for u in together], [min(frames, u.wants()) for u in together])
            for u, codes in zip(together, made):
                u.ready.extend(codes)
            self.shared_launches += 1
