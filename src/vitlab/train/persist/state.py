"""``last.pt``: everything needed to resume a run exactly, written atomically.

The file holds only tensors, numbers, strings and containers of them, so it loads with
``torch.load(weights_only=True)``: RNG states are stored as tensors, the run's
configuration as a JSON string.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..._fs import replacing
from ..._text import shell_word
from ...checkpoints.files import torch_load_safe
from ...errors import CheckpointError, ConfigError, OutputError
from ..conf.train_config import read_saved_config
from ..sizing.choice import Sizing

__all__ = ["atomic_torch_save", "check_state", "get_rng_state", "load_state", "read_resume_state", "set_rng_state"]


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
        raise CheckpointError(f"{p}: no checkpoint to resume from (train with --out {shell_word(p.parent)} first)")
    try:
        return torch_load_safe(p)
    except CheckpointError as e:  # say which file of the run it was
        raise CheckpointError(f"{p}: cannot read the resume checkpoint: {str(e).removeprefix(f'{p}: ')}") from None


def read_resume_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``last.pt`` for ``--resume``: read safely (:func:`load_state`) and checked to be what vitlab writes
    (:func:`check_state`), or one :class:`~vitlab.errors.CheckpointError` line naming the key at fault."""
    state = load_state(path)
    try:
        check_state(state)
    except (ConfigError, ValueError) as e:
        raise CheckpointError(
            f"{path}: not a resume checkpoint vitlab can continue from: {e}; start a new run (--overwrite)"
        ) from None
    return state


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def _tensor(v: Any, dtype: torch.dtype, *, length: int | None = None) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype == dtype and v.dim() == 1 and (length is None or len(v) == length)


def _shown(v: Any) -> str:
    text = repr(v) if not isinstance(v, torch.Tensor) else f"a {v.dtype} tensor of shape {tuple(v.shape)}"
    return f"{type(v).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def check_state(state: Any) -> None:
    """Refuse a ``last.pt`` whose contents are not what vitlab writes (a ``ValueError`` naming the first key at
    fault): a mapping whose counters are non-negative integers, numbers finite, plan a mapping of them, random generator
    states tensors of their sizes, weights and optimizer state mappings (or a sharded folder's name), and whose
    configuration passes as if typed (:func:`~vitlab.train.conf.train_config.read_saved_config`) and its sizing as
    :class:`~vitlab.train.sizing.Sizing` reads one. What ``--resume`` reads is then what it expects: a list or null
    where a number or the data belongs is one line, never a ``TypeError`` deep in the run."""
    if not isinstance(state, dict):
        raise ValueError(f"expected a mapping, got {_shown(state)}")

    def need(key: str, ok: Any, what: str, *, optional: bool = False) -> None:
        if key not in state:
            if optional:
                return
            raise ValueError(f"{key}: missing")
        if not ok(state[key]):
            raise ValueError(f"{key}: expected {what}, got {_shown(state[key])}")

    counter = (lambda v: _is_int(v) and v >= 0), "an integer >= 0"
    for key in ("epoch", "step", "train_images"):
        need(key, *counter)
    for key in ("micro_in_epoch", "samples_in_epoch", "epoch_loss_count", "epoch_nan_skipped"):
        need(key, *counter, optional=True)
    for key in ("best_top1", "wall_s", "train_s"):
        need(key, _is_number, "a finite number")
    need("epoch_loss_sum", _is_number, "a finite number", optional=True)
    need("epoch_tokens", lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(_is_int, v)),
         "two integers", optional=True)  # fmt: skip
    need("data_fingerprint", lambda v: isinstance(v, str), "JSON text", optional=True)
    need("plan", lambda v: isinstance(v, dict), "a mapping")
    plan = state["plan"]
    for key in ("epochs", "total_steps", "steps_per_epoch"):
        if not (_is_int(plan.get(key)) and plan[key] >= (0 if key != "steps_per_epoch" else 1)):
            raise ValueError(f"plan.{key}: expected an integer >= {0 if key != 'steps_per_epoch' else 1}, "
                             f"got {_shown(plan.get(key))}")  # fmt: skip
    if plan.get("warmup_steps") is not None and not (_is_int(plan["warmup_steps"]) and plan["warmup_steps"] >= 0):
        raise ValueError(f"plan.warmup_steps: expected an integer >= 0, got {_shown(plan['warmup_steps'])}")
    if "lr" in plan and not _is_number(plan["lr"]):
        raise ValueError(f"plan.lr: expected a finite number, got {_shown(plan['lr'])}")
    sharded = state.get("sharded")
    need("sharded", lambda v: v is None or isinstance(v, str), "a folder name", optional=True)
    for key in ("model", "optimizer") if not sharded else ():
        need(key, lambda v: isinstance(v, dict), "a mapping")
    need("scheduler", lambda v: isinstance(v, dict), "a mapping")
    for key in ("scaler", "ema"):
        need(key, lambda v: v is None or isinstance(v, dict), "a mapping or none", optional=True)
    need("loader_rng", lambda v: _tensor(v, torch.uint8), "a generator state (uint8 tensor)")
    for key in ("torch_rng_ranks", "cuda_rng_ranks"):
        need(key, lambda v: v is None or (isinstance(v, (list, tuple)) and all(_tensor(t, torch.uint8) for t in v)),
             "generator states (uint8 tensors)", optional=True)  # fmt: skip
    need("rng", lambda v: isinstance(v, dict), "a mapping")
    _check_rng(state["rng"])
    try:
        read_saved_config(state.get("config"))
    except ConfigError as e:
        raise ValueError(str(e)) from None
    if "sizing" in state:  # what the run chose (a last.pt from before the sizing room has none)
        need("sizing", lambda v: isinstance(v, str), "JSON text")
        try:
            Sizing.from_dict(json.loads(state["sizing"]))
        except (ValueError, RecursionError) as e:
            raise ValueError(f"sizing: {str(e)[:200]}") from None


def _check_rng(rng: dict[str, Any]) -> None:
    """The random generators' states :func:`get_rng_state` saves, by type and size."""
    gauss = rng.get("numpy_gauss")
    for key, ok, what in (
        ("python", lambda v: _tensor(v, torch.int64, length=625), "Python's state (625 int64)"),
        ("python_version", _is_int, "an integer"),
        ("python_gauss", lambda v: v is None or _is_number(v), "a number or none"),
        ("numpy", lambda v: _tensor(v, torch.int64, length=624), "NumPy's state (624 int64)"),
        ("numpy_pos", lambda v: _is_int(v) and 0 <= v <= 624, "an integer in [0, 624]"),
        ("torch", lambda v: _tensor(v, torch.uint8), "torch's state (a uint8 tensor)"),
    ):
        if not ok(rng.get(key)):
            raise ValueError(f"rng.{key}: expected {what}, got {_shown(rng.get(key))}")
    if not (isinstance(gauss, (list, tuple)) and len(gauss) == 2 and _is_int(gauss[0]) and _is_number(gauss[1])):
        raise ValueError(f"rng.numpy_gauss: expected (flag, number), got {_shown(gauss)}")
    cuda = rng.get("cuda")
    if cuda is not None and not (isinstance(cuda, (list, tuple)) and all(_tensor(t, torch.uint8) for t in cuda)):
        raise ValueError(f"rng.cuda: expected generator states (uint8 tensors), got {_shown(cuda)}")
