"""``last.pt``: everything needed to resume a run exactly, written atomically.

The file holds only tensors, numbers, strings and containers of them, so it loads with
``torch.load(weights_only=True)``: RNG states are stored as tensors, the run's
configuration as a JSON string.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..._fs import replacing
from ...checkpoints.files import torch_load_safe
from ...errors import CheckpointError, OutputError

__all__ = ["atomic_torch_save", "get_rng_state", "load_state", "set_rng_state"]


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write to a temporary file, fsync it, rename it over ``path`` and fsync the folder
    (:func:`~vitlab._fs.replacing`): a kill at any moment leaves either the old file or the new one, never
    half of one, and a link at ``path`` is replaced, never written through. A write failure (full disk,
    quota, permissions) removes the temporary file and raises a one-line
    :class:`~vitlab.errors.CheckpointError`; the previous ``path`` stays readable."""
    path = Path(path)
    try:
        with replacing(path, durable=True, what="the checkpoint") as tmp, open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
    except OutputError as e:  # never half a file left behind (a full disk stays full otherwise)
        raise CheckpointError(str(e)) from None


def get_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch (and CUDA) generator states as tensors and ints."""
    py_version, py_state, py_gauss = random.getstate()
    _np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": torch.tensor(py_state, dtype=torch.int64),
        "python_version": py_version,
        "python_gauss": py_gauss,
        "numpy": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        "numpy_pos": int(np_pos),
        "numpy_gauss": (int(np_has_gauss), float(np_gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate((state["python_version"], tuple(int(v) for v in state["python"].tolist()), state["python_gauss"]))
    has_gauss, gauss = state["numpy_gauss"]
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"], has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``last.pt`` safely (``weights_only=True``: no code can run)."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no checkpoint to resume from (train with --out {p.parent} first)")
    try:
        return torch_load_safe(p)
    except CheckpointError as e:  # say which file of the run it was
        raise CheckpointError(f"{p}: cannot read the resume checkpoint: {str(e).removeprefix(f'{p}: ')}") from None
