"""Python side of csrc/megakernel: builds it once (cached), and runs decode frames in it.

`attach(model)` gives the model a FrameKernel: whole frames (talker step, codec head, sampling, the
code predictor's 15 passes, the next input) in one persistent launch each, the host reading back codes.
It also gives the talker's and the code predictor's DecoderStack a kernel step, so any other one-token
forward of model.py runs its layer stack in one launch. Prefill stays on batched PyTorch matmuls, each layer's
attention prologue (q/k RMSNorm, RoPE, the K/V cache write: 16 eager kernels) in one launch of the extension's
(AttentionPrologue), its RMSNorms (each with the residual add before it) and SwiGLU activations in one each
(FusedMLP: gate and up in one GEMM), and writes the same KV layout. `attach_codec(decoder)` runs the speech codec's
SnakeBeta activations, RMSNorms, MLPs and attention prologues in it as well. Where CUDA, the compiler or a
supported GPU is missing, `MegakernelUnavailable` says why and the caller keeps the PyTorch path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.errors import ParleyError
from engine.tts.codec import Attention as CodecAttention, CodecDecoder, SnakeBeta
from engine.tts.model import MLP, Attention, DecoderStack, FrameState, KVCache, Qwen3TTS, RMSNorm
from engine.tts.prompt import TalkerInputs
from engine.tts.sampling import Sampler, SamplingOptions

# inside engine/ in a wheel (pyproject.toml), beside it in a checkout
_ENGINE = Path(__file__).resolve().parent.parent
CSRC = (_ENGINE / "csrc" if (_ENGINE / "csrc").is_dir() else _ENGINE.parent / "csrc") / "megakernel"
# the extension's sources; the build's hash covers CSRC's headers too
SOURCES = ("binding.cpp", "megakernel.cu", "attention_prologue.cu", "snake.cu", "rms_norm.cu", "swiglu.cu")
MAX_POSITIONS = 16384  # shared memory is planned for attention over this many cached positions

_module = None
log = logging.getLogger(__name__)


class MegakernelUnavailable(ParleyError):
    """The megakernel cannot run here; the message says why (the PyTorch engine is used instead)."""


def _build_target() -> tuple[str, Path]:
    """(the extension's name, its build folder) for these sources under this torch."""
    # every source and header in the name: a changed kernel builds anew instead of loading a stale one
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(CSRC.glob("*.[ch]*")))).hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return f"parley_megakernel_{digest}", base / "parley" / "megakernel" / f"torch-{torch.__version__}" / digest


def _check_gpu() -> tuple[int, int]:
    """The GPU's compute capability, where the megakernel can run on it."""
    if not torch.cuda.is_available():
        raise MegakernelUnavailable("the megakernel needs a CUDA GPU; none is available")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        name = torch.cuda.get_device_name()
        raise MegakernelUnavailable(f"the megakernel needs compute capability 8.0+, found {major}.{minor} ({name})")
    return major, minor


def _put_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH. The ninja package's copy sits beside the interpreter, a folder an app
    started as .venv/bin/parley-app, without activating the environment, does not have on PATH."""
    if shutil.which("ninja") is None:
        import ninja

        if ninja.BIN_DIR:  # "" where the package's copy is not found; an empty entry would mean the working folder
            os.environ["PATH"] = os.pathsep.join((ninja.BIN_DIR, os.environ.get("PATH", "")))


def needs_build() -> bool:
    """Whether build() would compile first (about a minute, once per kernel version): this GPU can run the
    kernel and its sources and a CUDA toolkit are found, but no built extension is cached yet."""
    if _module is not None or _missing_sources():
        return False
    try:
        _check_gpu()
    except MegakernelUnavailable:
        return False
    from torch.utils.cpp_extension import CUDA_HOME

    name, directory = _build_target()
    built = any((directory / (name + suffix)).is_file() for suffix in (".so", ".pyd"))
    return CUDA_HOME is not None and not built


def _missing_sources() -> list[str]:
    """The extension's sources not found where CSRC points (a copy of engine/ without csrc/: a checkout and a wheel
    built from one both have them)."""
    return [source for source in SOURCES if not (CSRC / source).is_file()]


def build():
    """Compile (first use only; cached on disk) and import the kernel extension."""
    global _module
    if _module is not None:
        return _module
    major, minor = _check_gpu()
    missing = _missing_sources()
    if missing:
        raise MegakernelUnavailable(f"the megakernel's sources are not installed ({CSRC} lacks {', '.join(missing)}); "
                                    f"install Parley again from its source folder")
    from torch.utils.cpp_extension import load

    _put_ninja_on_path()
    arch = "-gencode=arch=compute_90a,code=sm_90a" if (major, minor) == (9, 0) else f"-arch=sm_{major}{minor}"
    name, directory = _build_target()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        _module = load(
            name=name,
            sources=[str(CSRC / source) for source in SOURCES],
            extra_cuda_cflags=["-O3", "-std=c++17", arch],
            extra_include_paths=[str(CSRC)],
            build_directory=str(directory),
        )
    except (RuntimeError, OSError) as e:  # no CUDA toolkit or ninja, or the compiler failed
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if reason.startswith("Error building extension"):  # its message is the compiler's whole output
            log.warning("the megakernel's build failed:\n%s", e)
            reason = "the CUDA compiler failed; the log holds its output"
        raise MegakernelUnavailable(f"the megakernel could not be built ({reason})") from None
    return _module


def _require_bf16_cuda(weight: torch.Tensor) -> None:
    if weight.dtype != torch.bfloat16 or weight.device.type != "cuda":
        raise MegakernelUnavailable(f"the megakernel runs bf16 weights on CUDA, got {weight.dtype} on {weight.device}")


def _scratch(n: int, device) -> torch.Tensor:
    return torch.empty(n, dtype=torch.float32, device=device)


class KernelStep:
    """A DecoderStack's one-token step in the kernel: same weights, same KV cache, fp32 activations."""

    WEIGHTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
               "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
               "self_attn.k_norm.weight")

    def __init__(self, stack: DecoderStack, tokens: int = 1):
        """tokens: how many tokens the stack's scratch holds (2 for the code predictor, whose frame-kernel pass
        takes both prefill tokens at once)."""
        cfg = stack.cfg
        first = next(stack.parameters())
        _require_bf16_cuda(first)
        self.module = build()
        self.cfg = cfg
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
        self.blocks = self.module.plan_step_blocks(self.stack, MAX_POSITIONS)

    def __call__(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """x (1, hidden) -> final-normed hidden (1, hidden) in x's dtype; writes K/V at cache.length."""
        if cache.capacity > MAX_POSITIONS:
            raise RuntimeError(f"KV cache of {cache.capacity} positions exceeds the kernel's {MAX_POSITIONS}")
        out = _scratch(self.cfg.hidden_size, x.device)
        self.module.decoder_step(self.stack, cache.k, cache.v, cache.length, x.reshape(-1).float().contiguous(), out,
                                 self.blocks)
        cache.length += 1
        return out.to(x.dtype)[None]


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
        self._heads = pointer_table([h.weight for h in cp.lm_head])
        self._embeddings = pointer_table(self._tables)
        proj = cp.small_to_mtp_projection
        projected = isinstance(proj, torch.nn.Linear)
        H, Hp = self.cfg.decoder.hidden_size, self.cfg.predictor.hidden_size
        self.talker_in = _scratch(H, device)
        self.hidden = _scratch(H, device)
        # logits, talker_in, and the predictor's inputs for its two-token first pass (predictor_in, predictor_src)
        self._scratch = [_scratch(max(self.cfg.decoder.vocab_size, self.cfg.predictor.vocab_size), device),
                         self.talker_in, _scratch(2 * Hp, device), _scratch(2 * H, device)]
        self.params = self.module.frames(talker.stack, predictor.stack, t.codec_head.weight, self._heads,
                                         self.cfg.predictor.vocab_size, self._embeddings,
                                         proj.weight if projected else None, proj.bias if projected else None,
                                         *self._scratch)
        self.predictor_cache = KVCache(self.cfg.predictor, len(self._tables), device, torch.bfloat16)
        self.frames_done = torch.empty(1, dtype=torch.int32, device=device)
        self.blocks = self.module.plan_frame_blocks(self.params, MAX_POSITIONS)

    @staticmethod
    def supports(options: SamplingOptions) -> bool:
        return options.top_p == 1.0 and options.predictor_top_p == 1.0

    def run(self, state: FrameState, sampler: Sampler, inputs: TalkerInputs, cap: int, cancelled,
            per_launch: int = 1) -> Iterator[torch.Tensor]:
        """Codes (16,) of each frame from `state` (just after begin()) until EOS, `cap` frames, or cancel.

        The first launch runs one frame (the lowest latency to first audio), later ones `per_launch`.
        """
        if state.cache.capacity > MAX_POSITIONS:
            raise RuntimeError(f"KV cache of {state.cache.capacity} positions exceeds the kernel's {MAX_POSITIONS}")
        o, cache = sampler.options, state.cache
        self.hidden.copy_(state.hidden.float())
        advance = False
        while state.frame < cap and not cancelled.is_set():
            n = 1 if state.frame == 0 else min(per_launch, cap - state.frame)
            codes = torch.empty((n, len(self._tables)), dtype=torch.int64, device=self.hidden.device)
            self.module.run_frames(
                self.params, cache.k, cache.v, self.predictor_cache.k, self.predictor_cache.v, cache.length, advance,
                state.frame, sampler.min_frames, sampler.eos_id, sampler.seed, o.repetition_penalty, o.temperature,
                o.top_k, o.predictor_temperature, o.predictor_top_k, sampler.suppress.view(torch.uint8),
                sampler.seen.view(torch.uint8), inputs.text_inputs(state.frame, n), self.hidden, codes,
                self.frames_done, self.blocks)
            done = int(self.frames_done.item())
            # talker steps taken: one before each frame but the launch's first (unless advancing),
            # and the EOS frame's too
            ran = done + (done < n)
            cache.length += ran - 1 + advance
            for i in range(done):
                state.frame += 1
                yield codes[i]
            if done < n:
                return
            advance = True


class Stacked:
    """Linears of one input as one GEMM: their weights (and biases) stacked into one tensor, which they then view
    (the same values, held once: the separate copies are freed); a call returns each one's output, split back."""

    def __init__(self, *linears: torch.nn.Linear):
        with torch.no_grad():
            self.weight = torch.cat([linear.weight for linear in linears])
            self.bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears])
        self.rows = [linear.weight.shape[0] for linear in linears]
        for linear, weight in zip(linears, self.weight.split(self.rows)):
            linear.weight.data = weight
        if self.bias is not None:
            for linear, bias in zip(linears, self.bias.split(self.rows)):
                linear.bias.data = bias

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x (rows, in) -> each linear's (rows, out), views of one output."""
        return F.linear(x, self.weight, self.bias).split(self.rows, dim=1)


class AttentionPrologue:
    """A multi-token Attention.forward up to its attention in two launches: q, k and v from one GEMM, then q and k
    RMSNorm'd per head and rotated and K and V written into the cache at its length
    (csrc/megakernel/attention_prologue.cu, rounding to bf16 after each step as model.py does). Returns q
    (heads, T, head_dim)."""

    def __init__(self, attention: Attention, module):
        self.qkv = Stacked(attention.q_proj, attention.k_proj, attention.v_proj)
        # the norms' weights, not the module: the module holds this object, and no reference cycle keeps it alive
        self.q_norm, self.k_norm, self.eps = attention.q_norm.weight, attention.k_norm.weight, attention.q_norm.eps
        self.module = module

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
                 layer: int) -> torch.Tensor:
        return self.module.attention_prologue(*self.qkv(x), self.q_norm, self.k_norm, cos, sin, cache.k, cache.v,
                                              layer, cache.length, self.eps)


class WindowPrologue:
    """The codec's Attention.forward in a stream, up to its attention, in four launches: q, k and v from one GEMM,
    the stream's kept keys and values copied into the window's first rows, then q and k rotated and the new keys and
    values written after them (attention_prologue.cu without the norm, the window as a one-layer cache). Returns q
    (1, heads, T, head_dim) and the window's keys and values (1, kv_heads, kept + T, head_dim)."""

    def __init__(self, attention: CodecAttention, module):
        self.qkv = Stacked(attention.q_proj, attention.k_proj, attention.v_proj)
        self.module = module

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kept, T = keys.shape[2], x.shape[1]
        windows = []
        for past in (keys, values):
            window = past.new_empty(1, past.shape[1], kept + T, past.shape[3])
            window[:, :, :kept].copy_(past)
            windows.append(window)
        q = self.module.attention_prologue(*self.qkv(x[0]), None, None, cos, sin, *windows, 0, kept, 0.0)
        return q[None], *windows


class FusedMLP:
    """model.py's MLP in three launches: gate and up from one GEMM, silu(gate) * up in one (csrc/megakernel/swiglu.cu,
    rounding as F.silu and the product do), then down_proj."""

    def __init__(self, mlp: MLP, module):
        self.gate_up = Stacked(mlp.gate_proj, mlp.up_proj)
        self.down_proj, self.module = mlp.down_proj, module  # a child of mlp: no reference cycle back to it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x.reshape(-1, x.shape[-1]))
        return self.down_proj(self.module.swiglu(gate, up)).view(*x.shape[:-1], -1)


def _fuse(modules, module) -> None:
    """RMSNorms and MLPs among `modules` to the extension's kernels."""
    for m in modules:
        if isinstance(m, RMSNorm):
            m.kernel, m.add_kernel = module.rms_norm, module.add_rms_norm
        elif isinstance(m, MLP):
            m.fused = FusedMLP(m, module)


def attach(model: Qwen3TTS) -> None:
    """Run every single-token step of the talker and the code predictor in the kernel, every multi-token one's
    attention prologue, RMSNorms and MLP activations in launches of the extension's own, and give the model a
    FrameKernel (model.frame_kernel) for whole frames.

    Raises:
        MegakernelUnavailable: no CUDA GPU of compute capability 8.0+, no compiler, non-bf16 weights, or a model
            beyond the kernel's limits (csrc/megakernel/params.h); the decode steps then stay on PyTorch, the
            multi-token kernels above attached all the same.
    """
    talker, predictor = model.talker.model, model.talker.code_predictor.model
    _require_bf16_cuda(next(talker.parameters()))
    module = build()
    # first: these move the q/k/v and gate/up weights, whose addresses the kernel steps keep
    for layer in (*talker.layers, *predictor.layers):
        layer.self_attn.prologue = AttentionPrologue(layer.self_attn, module)
    _fuse(model.modules(), module)
    try:
        steps = KernelStep(talker), KernelStep(predictor, tokens=2)
        frame_kernel = FrameKernel(model, *steps)
    except RuntimeError as e:  # the binding refuses what the kernel was not planned for: too wide, too many layers
        raise MegakernelUnavailable(f"the megakernel does not run this model ({str(e).splitlines()[0]})") from None
    talker.kernel_step, predictor.kernel_step = steps
    model.frame_kernel = frame_kernel


def attach_codec(decoder: CodecDecoder) -> None:
    """Run the speech codec's SnakeBeta activations in one launch each (csrc/megakernel/snake.cu), not five, and its
    transformer's RMSNorms and MLPs as the talker's and its attention's projections, RoPE and window in a stream in
    four launches (WindowPrologue); before the decoder's first stream on CUDA, whose graphs keep the ops they were
    captured with.

    Raises:
        MegakernelUnavailable: no CUDA GPU of compute capability 8.0+, no compiler, or non-bf16 weights.
    """
    _require_bf16_cuda(decoder.pre_conv.conv.weight)
    module = build()
    for m in decoder.modules():
        if isinstance(m, SnakeBeta):
            m.kernel = module.snake
        elif isinstance(m, CodecAttention):
            m.prologue = WindowPrologue(m, module)
    _fuse(decoder.modules(), module)
