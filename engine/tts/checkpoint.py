"""Safetensors weights into a module built from config: single or sharded files, checked tensor by tensor.

The module is built on the meta device, so the expected name and shape of every tensor come from the
config; a missing, unexpected or mis-shaped tensor is an error naming the file and tensor, and the
weights are loaded straight into the requested device and dtype (no random init, no second copy).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from engine.errors import ModelFilesError


def weight_files(folder: Path, stem: str = "model") -> dict[str, Path]:
    """tensor name -> file holding it, from `stem.safetensors` or its sharded `stem.safetensors.index.json`."""
    index = folder / f"{stem}.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as e:
            raise ModelFilesError(f"{index}: not a valid shard index ({e})") from None
        files = {name: folder / shard for name, shard in weight_map.items()}
        for path in set(files.values()):
            if not path.exists():
                raise ModelFilesError(f"{path}: shard named in {index.name} is missing")
        return files
    single = folder / f"{stem}.safetensors"
    if not single.exists():
        raise ModelFilesError(f"{single}: file is missing (no {stem}.safetensors or {index.name})")
    with _open(single) as f:
        return {name: single for name in f.keys()}


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as e:  # safetensors raises its own error type for truncated or corrupt headers
        raise ModelFilesError(f"{path}: cannot read the weights, is the file truncated or corrupt? ({e}); "
                              "download it again") from None


def load_weights(module: nn.Module, folder: Path, *, stem: str = "model", prefix: str = "",
                 ignore: tuple[str, ...] = (), device="cpu", dtype=torch.float32) -> nn.Module:
    """Fill a meta-device `module` with the tensors of folder/stem.safetensors whose names start with prefix.

    Names are matched after removing `prefix`; names starting with an entry of `ignore` are skipped.
    Floating tensors are cast to dtype; all land on device. Returns the module, materialized.

    Raises:
        ModelFilesError: a file is missing, truncated or corrupt, or a tensor is missing, unexpected
            or of the wrong shape (the message names the file and tensor).
    """
    expected = {name: tuple(t.shape) for name, t in module.state_dict().items()}
    files = weight_files(folder, stem)
    by_file: dict[Path, list[str]] = {}
    for name, path in files.items():
        if name.startswith(prefix) and not name.startswith(ignore):
            by_file.setdefault(path, []).append(name)
    state = {}
    for path, names in by_file.items():
        with _open(path) as f:
            for name in names:
                key = name[len(prefix):]
                if key not in expected:
                    raise ModelFilesError(f"{path}: unexpected tensor {name}; "
                                          "the checkpoint does not match its config.json")
                try:
                    tensor = f.get_tensor(name)
                except Exception as e:
                    raise ModelFilesError(f"{path}: tensor {name} cannot be read ({e}); the file is damaged") from None
                if tuple(tensor.shape) != expected[key]:
                    raise ModelFilesError(f"{path}: {name} is {tuple(tensor.shape)}, config.json says {expected[key]}")
                state[key] = tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else tensor.dtype)
    missing = [k for k in expected if k not in state]
    if missing:
        where = sorted({str(p) for p in by_file}) or [str(folder / f"{stem}.safetensors")]
        raise ModelFilesError(f"{', '.join(where)}: missing tensor {prefix}{missing[0]}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    module.load_state_dict(state, strict=True, assign=True)
    return module.eval().requires_grad_(False)
