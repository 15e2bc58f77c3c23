"""The persistent kernels of csrc/megakernel/: decode frames and one-token steps, each in one launch.

`attach(model)` gives the model a FrameKernel: whole frames (talker step, codec head, sampling, the code predictor's
15 passes, the next input) in one persistent launch each, the host reading back codes. It also gives the talker's
and the code predictor's DecoderStack a kernel step, so any other one-token forward of model.py runs its layer stack
in one launch. A BatchKernel makes the frames of several utterances in one launch, each as its FrameKernel would.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine.tts.chunks import chunk_size
from engine.tts.kernels import fused
from engine.tts.kernels.build import MegakernelUnavailable, build, require_bf16_cuda
from engine.tts.model import DecoderStack, FrameState, KVCache, Qwen3TTS
from engine.tts.prompt import TalkerInputs
from engine.tts.sampling import Sampler, SamplingOptions

MAX_POSITIONS = 16384  # shared memory is planned for attention over this many cached positions


def _scratch(n: int, device) -> torch.Tensor:
    return torch.empty(n, dtype=torch.float32, device=device)


def _frame_params(model: Qwen3TTS, talker: KernelStep, predictor: KernelStep, heads: torch.Tensor,
                  embeddings: torch.Tensor, streams: int):
    """The frame loop's parameters (csrc make_frames) for `streams` utterances a launch, on the stacks' steps (with
    scratch for as many tokens, twice as many for the predictor), and the scratch they point at, for every utterance:
    logits, talker_in, and the predictor's inputs for its two-token first pass (predictor_in, predictor_src)."""
    t = model.talker
    cfg, device = t.cfg, t.codec_head.weight.device
    H, Hp = cfg.decoder.hidden_size, cfg.predictor.hidden_size
    scratch = [_scratch(streams * max(cfg.decoder.vocab_size, cfg.predictor.vocab_size), device),
               _scratch(streams * H, device), _scratch(2 * streams * Hp, device), _scratch(2 * streams * H, device)]
    proj = t.code_predictor.small_to_mtp_projection
    projected = isinstance(proj, torch.nn.Linear)
    params = talker.module.frames(talker.stack, predictor.stack, t.codec_head.weight, heads, cfg.predictor.vocab_size,
                                  embeddings, proj.weight if projected else None, proj.bias if projected else None,
                                  *scratch, streams)
    return params, scratch


class KernelStep:
    """A DecoderStack's one-token step in the kernel: same weights, same KV cache, fp32 activations.

    design "barrier" (the engine's) runs stack_step (csrc/megakernel/decoder_step.cuh), its stages ended by grid
    barriers; "dataflow" runs csrc/megakernel/dataflow.cuh, whose stages wait only for counters of their producers
    while each block streams its next weights into shared memory. The dataflow step reads a flag back after each
    launch (a host synchronization), so that a stalled launch raises instead of hanging.
    """

    WEIGHTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
               "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
               "self_attn.k_norm.weight")
    DESIGNS = ("barrier", "dataflow")
    # where a dataflow launch stalled: DataflowParams.stalled's stage (csrc/megakernel/params.h)
    STAGES = ("A (q/k/v)", "B (attention)", "C (o_proj)", "D (gate/up)", "E (down)", "F (final norm)")

    def __init__(self, stack: DecoderStack, tokens: int = 1, design: str = "barrier", ring_pages: int | None = None):
        """tokens: how many tokens the stack's scratch holds (2 for the code predictor, whose frame-kernel pass
        takes both prefill tokens at once). design: one of DESIGNS. ring_pages: the dataflow step's weight ring in
        pages, at least 2, the rest of the SM's shared memory left to its L1 (None: as many as its shared memory
        holds)."""
        if design not in self.DESIGNS:
            raise ValueError(f"unknown kernel step design {design!r}; one of: {', '.join(self.DESIGNS)}")
        if ring_pages is not None and (design != "dataflow" or ring_pages < 2):
            raise ValueError(f"ring_pages is the dataflow step's, at least 2; got {ring_pages} for {design!r}")
        self.ring_pages = ring_pages
        cfg = stack.cfg
        first = next(stack.parameters())
        require_bf16_cuda(first)
        self.module = build()
        self.cfg = cfg
        self.design = design
        device = first.device
        params = [dict(layer.named_parameters()) for layer in stack.layers]
        pointers = [[layer[name].data_ptr() for name in self.WEIGHTS] for layer in params]
        self.layers = torch.tensor(pointers, dtype=torch.int64, device=device)  # kept alive: the kernel reads it
        self.scratch = [_scratch(tokens * n, device)
                        for n in (cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim,
                                  cfg.num_heads * cfg.head_dim, cfg.intermediate_size)]
        dims = [cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim]
        self.stack = self.module.stack(self.layers, dims, cfg.rms_norm_eps, cfg.rope_theta, stack.norm.weight,
                                       *self.scratch, tokens)
        if design == "dataflow":
            self.blocks, self.shared_bytes = self.module.plan_dataflow(self.stack, MAX_POSITIONS)
            # (layers, 5) int32: what each stage of each layer has counted done, over every launch so far
            self.counters = torch.zeros(cfg.num_layers * 5, dtype=torch.int32, device=device)
            self.stalled = torch.zeros(1, dtype=torch.int32, device=device)  # where a launch stalled (0: none)
            self.launches = 0  # launches made on these counters
        else:
            self.blocks = self.module.plan_step_blocks(self.stack, MAX_POSITIONS)

    def __call__(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """x (1, hidden) -> final-normed hidden (1, hidden) in x's dtype; writes K/V at cache.length.

        Raises:
            RuntimeError: the cache is beyond the kernel's size, or a dataflow launch stalled (check()).
        """
        out = _scratch(self.cfg.hidden_size, x.device)
        self.launch(x.reshape(-1).float().contiguous(), out, cache)
        self.check()
        cache.length += 1
        return out.to(x.dtype)[None]

    def launch(self, x: torch.Tensor, out: torch.Tensor, cache: KVCache) -> None:
        """The step's launch alone, with no host synchronization: x (hidden,) fp32 -> out (hidden,) fp32, K/V
        written at cache.length, which the caller advances once the step is known good (check())."""
        if cache.capacity > MAX_POSITIONS:
            raise RuntimeError(f"KV cache of {cache.capacity} positions exceeds the kernel's {MAX_POSITIONS}")
        if self.design == "barrier":
            self.module.decoder_step(self.stack, cache.k, cache.v, cache.length, x, out, self.blocks)
            return
        step = self.launches + 1  # counted only once launched: the counters wait for this many launches' work
        self.module.dataflow_step(self.stack, cache.k, cache.v, cache.length, x, out, self.counters, self.stalled,
                                  step, self.blocks, self.shared_bytes, self.ring_pages or 0)
        self.launches = step

    def check(self) -> None:
        """Raises RuntimeError where a dataflow launch so far stalled (a wait on its inputs timed out: a bug, never
        slowness); the counters are then reset, so the next launch starts afresh. Synchronizes with the GPU."""
        if self.design == "barrier":
            return
        code = int(self.stalled.item())
        if code:
            self.counters.zero_()
            self.stalled.zero_()
            self.launches = 0
            layer, stage = divmod(code - 1, 8)
            raise RuntimeError(f"dataflow step stalled at layer {layer} stage {self.STAGES[stage]}: a wait for its "
                               f"inputs timed out; the launch ended early, its output and K/V are not valid")


@dataclass
class KernelRun:
    """One utterance's frames made launch by launch (FrameKernel, BatchKernel): where it stands, and what a launch
    leaves for its next."""

    state: FrameState
    sampler: Sampler
    inputs: TalkerInputs
    cap: int  # frames at most
    hidden: torch.Tensor  # (H,) fp32: the talker's last final-normed state
    next_input: torch.Tensor  # (H,) fp32: the input of its next talker step (once `advance`)
    advance: bool = False  # a launch has run: the next one starts with a talker step on next_input
    ended: bool = False  # EOS, or cap frames made

    @classmethod
    def start(cls, state: FrameState, sampler: Sampler, inputs: TalkerInputs, cap: int) -> KernelRun:
        """A run from `state` just after begin()."""
        if state.cache.capacity > MAX_POSITIONS:
            raise RuntimeError(f"KV cache of {state.cache.capacity} positions exceeds the kernel's {MAX_POSITIONS}")
        hidden = state.hidden.reshape(-1).to(torch.float32, copy=True)
        return cls(state, sampler, inputs, cap, hidden, torch.zeros_like(hidden), ended=state.frame >= cap)

    def wants(self, per_launch: int) -> int:
        """Frames its next launch makes: its next chunk's (engine/tts/chunks.py: one frame each for the first two, then
        `per_launch`), within its cap."""
        return min(chunk_size(self.state.frame, per_launch), self.cap - self.state.frame)

    def made(self, done: int, frames: int, codes: torch.Tensor) -> list[torch.Tensor]:
        """Counts a launch that made `done` of the `frames` it was asked for; returns their codes (16,) each, from
        codes (frames, 16)."""
        # talker steps taken: one before each frame but the launch's first (unless advancing), and the EOS frame's too
        self.state.cache.length += done + (done < frames) - 1 + self.advance
        self.state.frame += done
        self.advance = True
        self.ended = done < frames or self.state.frame >= self.cap
        return list(codes[:done])


class FrameKernel:
    """Whole decode frames in one launch each: talker step, codec head, sampling, the code predictor's
    15 passes and the next input's embedding sum, all on the device (csrc/megakernel/frame.cuh).

    Sampling equals engine/tts/sampling.py's Sampler (the same counter-based Gumbel noise) for top_p = 1,
    the official default; other top_p values keep the PyTorch loop (`supports`).
    """

    def __init__(self, model: Qwen3TTS, talker: KernelStep, predictor: KernelStep):
        t = model.talker
        cp = t.code_predictor
        device = t.codec_head.weight.device
        self.module, self.cfg = talker.module, t.cfg
        self._steps = (talker, predictor)  # their stacks' layer tables and scratch stay alive with this object
        self._tables = [t.model.codec_embedding.weight, *(e.weight for e in cp.model.codec_embedding)]
        pointer_table = lambda ts: torch.tensor([x.data_ptr() for x in ts], dtype=torch.int64, device=device)  # noqa: E731
        # device pointers to the predictor's 15 heads and the 16 codebooks' embedding tables (BatchKernel's too)
        self.heads = pointer_table([h.weight for h in cp.lm_head])
        self.embeddings = pointer_table(self._tables)
        self.params, self._scratch = _frame_params(model, talker, predictor, self.heads, self.embeddings, 1)
        # the next talker step's input, which a launch leaves for the next one of its stream (the run keeps a copy)
        self.talker_in = self._scratch[1]
        self.predictor_cache = KVCache(self.cfg.predictor, len(self._tables), device, torch.bfloat16)
        self.frames_done = torch.empty(1, dtype=torch.int32, device=device)
        self.blocks = self.module.plan_frame_blocks(self.params, MAX_POSITIONS)

    @staticmethod
    def supports(options: SamplingOptions) -> bool:
        return options.top_p == 1.0 and options.predictor_top_p == 1.0

    def run(self, state: FrameState, sampler: Sampler, inputs: TalkerInputs, cap: int, cancelled,
            per_launch: int = 1) -> Iterator[torch.Tensor]:
        """Codes (16,) of each frame from `state` (just after begin()) until EOS, `cap` frames, or cancel, made
        a chunk a launch (KernelRun.wants)."""
        run = KernelRun.start(state, sampler, inputs, cap)
        while not run.ended and not cancelled.is_set():
            yield from self.launch(run, run.wants(per_launch))

    def launch(self, run: KernelRun, frames: int) -> list[torch.Tensor]:
        """One launch of `run`'s next frames, 1 to what its cap leaves; their codes (16,) each, fewer at EOS.

        Runs of several streams may be interleaved launch by launch (one launch at a time): what a launch leaves for
        the next, the talker's state and its next input, is the run's own, and the kernel's shared buffers
        (scratch, logits, the predictor's cache) are written before they are read in every launch.
        """
        o, state, sampler, cache = run.sampler.options, run.state, run.sampler, run.state.cache
        codes = torch.empty((frames, len(self._tables)), dtype=torch.int64, device=run.hidden.device)
        if run.advance:  # the launch starts with a talker step on the input the previous launch left
            self.talker_in.copy_(run.next_input)
        self.module.run_frames(
            self.params, cache.k, cache.v, self.predictor_cache.k, self.predictor_cache.v, cache.length, run.advance,
            state.frame, sampler.min_frames, sampler.eos_id, sampler.seed, o.repetition_penalty, o.temperature,
            o.top_k, o.predictor_temperature, o.predictor_top_k, sampler.suppress.view(torch.uint8),
            sampler.seen.view(torch.uint8), run.inputs.text_inputs(state.frame, frames), run.hidden, codes,
            self.frames_done, self.blocks)
        run.next_input.copy_(self.talker_in)
        return run.made(int(self.frames_done.item()), frames, codes)


class BatchKernel:
    """Whole decode frames of up to `streams` utterances (2, 4 or 8) in one launch (csrc/megakernel/batch.cuh): each
    weight is read once for all of them, and each utterance gets the very codes its FrameKernel launches would give
    it, whichever utterances share its launches and whenever it joins or leaves them.

    Sampling as FrameKernel's (`supports`); the utterances of a launch may sample differently.
    """

    SIZES = (2, 4, 8)

    def __init__(self, model: Qwen3TTS, streams: int):
        """model: one with a FrameKernel (attach), whose tables this one shares."""
        if streams not in self.SIZES:
            raise ValueError(f"a batched launch takes {' or '.join(map(str, self.SIZES))} streams, got {streams}")
        if model.frame_kernel is None:
            raise ValueError("the model has no frame kernel (megakernel.attach)")
        t, heads, embeddings = model.talker, model.frame_kernel.heads, model.frame_kernel.embeddings
        cfg, device = t.cfg, t.codec_head.weight.device
        self.streams, self.cfg = streams, cfg
        self._groups = embeddings.numel()
        # the stacks again, with scratch for a token a stream (the predictor's first pass: two)
        self._steps = (KernelStep(t.model, tokens=streams), KernelStep(t.code_predictor.model, tokens=2 * streams))
        self.module = self._steps[0].module
        self._tables = (heads, embeddings)  # kept alive with this object: the kernel reads them
        self.params, self._scratch = _frame_params(model, *self._steps, heads, embeddings, streams)
        p = cfg.predictor
        shape = (streams, p.num_layers, p.num_kv_heads, self._groups, p.head_dim)
        self._predictor_k = torch.empty(shape, dtype=torch.bfloat16, device=device)
        self._predictor_v = torch.empty(shape, dtype=torch.bfloat16, device=device)
        self.blocks = self.module.plan_frame_blocks(self.params, MAX_POSITIONS)

    def launch(self, runs: list[KernelRun], frames: list[int]) -> list[list[torch.Tensor]]:
        """One launch: run i makes up to frames[i] frames (at least 1, at most what its cap leaves); returns each
        run's codes (16,) a frame. A run that picks EOS or reaches its cap is `ended`. The runs' samplers suppress
        the same codes and end at the same EOS (one engine's)."""
        if not 1 <= len(runs) <= self.streams or len(frames) != len(runs):
            raise ValueError(f"a launch takes 1 to {self.streams} runs and a frame count each")
        if len({run.sampler.eos_id for run in runs}) > 1:
            raise ValueError("the runs of a launch end at different EOS codes")
        if any(run.ended or not 1 <= n <= run.cap - run.state.frame for run, n in zip(runs, frames)):
            raise ValueError("each run must be going on, and make 1 to the frames its cap leaves")
        S, F, H, device = self.streams, max(frames), self.cfg.decoder.hidden_size, runs[0].hidden.device
        vocab = self.cfg.decoder.vocab_size
        text = torch.zeros((S, F, H), dtype=torch.float32, device=device)
        hidden = torch.zeros((S, H), dtype=torch.float32, device=device)
        talker_in = torch.zeros((S, H), dtype=torch.float32, device=device)
        seen = torch.zeros((S, vocab), dtype=torch.uint8, device=device)
        streams = []
        for i, (run, n) in enumerate(zip(runs, frames)):
            o, state = run.sampler.options, run.state
            text[i, :n] = run.inputs.text_inputs(state.frame, n)
            hidden[i], talker_in[i], seen[i] = run.hidden, run.next_input, run.sampler.seen.view(torch.uint8)
            streams.append(self.module.stream(
                state.cache.k, state.cache.v, state.cache.length, run.advance, n, state.frame,
                run.sampler.min_frames, run.sampler.seed, o.repetition_penalty, o.temperature, o.top_k,
                o.predictor_temperature, o.predictor_top_k))
        codes = torch.empty((S, F, self._groups), dtype=torch.int64, device=device)
        done = torch.empty(S, dtype=torch.int32, device=device)
        first = runs[0].sampler
        self.module.run_batch(self.params, streams, self._predictor_k, self._predictor_v, first.eos_id,
                              first.suppress.view(torch.uint8), seen, text, hidden, talker_in, codes, done,
                              self.blocks)
        made = []
        for i, (run, n, d) in enumerate(zip(runs, frames, done.tolist())):
            run.hidden.copy_(hidden[i])
            run.next_input.copy_(talker_in[i])
            run.sampler.seen.copy_(seen[i].bool())
            made.append(run.made(d, n, codes[i]))
        return made


def attach(model: Qwen3TTS) -> None:
    """Run every single-token step of the talker and the code predictor in the kernel, and give the model a
    FrameKernel (model.frame_kernel) for whole frames; the fused kernels (fused.attach) first.

    Raises:
        MegakernelUnavailable: no CUDA GPU of compute capability 8.0+, no compiler, non-bf16 weights, or a model
            beyond the kernel's limits (csrc/megakernel/params.h); the decode steps then stay on PyTorch, the fused
            kernels attached all the same.
    """
    fused.attach(model)  # first: it moves the q/k/v and gate/up weights, whose addresses the kernel steps keep
    talker, predictor = model.talker.model, model.talker.code_predictor.model
    try:
        steps = KernelStep(talker), KernelStep(predictor, tokens=2)
        frame_kernel = FrameKernel(model, *steps)
    except RuntimeError as e:  # the binding refuses what the kernel was not planned for: too wide, too many layers
        raise MegakernelUnavailable(f"the megakernel does not run this model ({str(e).splitlines()[0]})") from None
    talker.kernel_step, predictor.kernel_step = steps
    model.frame_kernel = frame_kernel
