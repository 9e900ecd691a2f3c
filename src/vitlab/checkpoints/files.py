"""Reading tensors from files without ever running code from them.

``.safetensors`` holds tensors only; ``.pth``/``.bin``/``.pt`` files are pickles and
are read with ``torch.load(weights_only=True)``, which refuses any object that is
not a tensor or a plain container (a ``__reduce__`` payload raises instead of
running); ``.npz`` files are read with ``numpy.load(allow_pickle=False)``.
Every failure becomes a one-line :class:`~vitlab.errors.CheckpointError`.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError

__all__ = ["TORCH_SUFFIXES", "read_npz", "read_state_dict", "torch_load_safe", "unwrap_state_dict"]

TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pth.tar")
# Wrappers that training scripts put around the state dict, most specific first.
_WRAPPER_KEYS = ("state_dict", "model", "module", "model_state_dict", "model_state", "params")


def _first_line(e: BaseException) -> str:
    msg = str(e).strip()
    return msg.splitlines()[0] if msg else type(e).__name__


def read_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The flat ``{name: tensor}`` of a ``.safetensors`` or PyTorch pickle file."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no such checkpoint file")
    with open(p, "rb") as f:
        magic = f.read(9)
    if p.suffix.lower() == ".safetensors" or (len(magic) == 9 and magic[8:9] == b"{" and not magic.startswith(b"PK")):
        from safetensors.torch import load_file

        try:
            return load_file(str(p))
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{p}: not a readable safetensors file ({_first_line(e)})") from None
    obj = torch_load_safe(p)
    return unwrap_state_dict(obj, source=str(p))


def torch_load_safe(p: Path, *, what: str = "PyTorch checkpoint") -> Any:
    """``torch.load(weights_only=True)`` with one-line errors: a file whose pickle holds anything
    but tensors and plain containers is refused by name (loading it could run code)."""
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols it may not read; the error below says it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        m = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if m:
            raise CheckpointError(
                f"{p}: refused to unpickle: the file holds a {m.group(1)} object, not only tensors, "
                "and loading it could run code (vitlab reads pickles with torch.load(weights_only=True)); "
                "if you trust it, re-save it as a plain state dict or .safetensors"
            ) from None
        raise CheckpointError(f"{p}: not a {what} (pickle data that torch's safe loader cannot read)") from None
    except Exception as e:  # zip/pickle/EOF errors of random or truncated files
        raise CheckpointError(f"{p}: not a {what} ({_first_line(e)})") from None


def unwrap_state_dict(obj: Any, *, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Find the state dict inside what a training script saved: ``{"model": sd, "epoch": 3}``,
    ``{"state_dict": sd}``, DataParallel's ``module.`` prefixes ... (tensors only)."""
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source}: holds a {type(obj).__name__}, not a state dict of named tensors")
    for key in _WRAPPER_KEYS:
        inner = obj.get(key)
        if isinstance(inner, Mapping) and any(isinstance(v, torch.Tensor) for v in inner.values()):
            obj = inner
            break
    state = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not state:
        raise CheckpointError(f"{source}: holds no tensors (keys: {', '.join(map(str, list(obj)[:6])) or 'none'})")
    for prefix in ("module.", "_orig_mod."):  # DataParallel/DDP, torch.compile
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


def read_npz(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file, never unpickling objects."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no such checkpoint file")
    try:
        with np.load(p, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise CheckpointError(f"{p}: a single .npy array, not an .npz archive of named arrays")
            return {k: z[k] for k in z.files}
    except CheckpointError:
        raise
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise CheckpointError(
                f"{p}: refused to load pickled objects from .npz (allow_pickle=False); only numeric arrays load"
            ) from None
        raise CheckpointError(f"{p}: not a readable .npz archive ({_first_line(e)})") from None
    except Exception as e:
        raise CheckpointError(f"{p}: not a readable .npz archive ({_first_line(e)})") from None
