"""Pieces several sub-commands share: the architecture flags as model overrides, the ``--device``
and ``--model`` options, and writing a result as JSON. Import-light at module level, like every
``add_parser``: ``vitlab --help`` loads no torch."""

from __future__ import annotations

import argparse
import difflib
import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "ARCH_FLAGS",
    "DEVICE_HELP",
    "MODEL_HELP",
    "add_device_arg",
    "add_model_arg",
    "arch_overrides",
    "resolve_model",
    "write_json",
]

ARCH_FLAGS = {
    "patch_size": "patch_size",
    "dim": "embed_dim",
    "depth": "depth",
    "heads": "num_heads",
    "mlp_ratio": "mlp_ratio",
}
"""Command-line destination (``--dim`` -> ``dim``) -> the :class:`~vitlab.models.ViTConfig` field it sets.
``mlp_ratio`` is no field: the model builder turns it into ``mlp_dim`` with
:func:`vitlab.models.config.mlp_dim_for` once the final width is known."""

DEVICE_HELP = "auto (cuda when available, else cpu), cpu, cuda, cuda:1 ..."
MODEL_HELP = "a `vitlab train` output folder, anything `vitlab.load` reads, or a registered name (random init)"


def arch_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The architecture flags given on the command line (``--patch-size``, ``--dim``, ``--depth``,
    ``--heads``, ``--mlp-ratio``, ``--posemb``, ``--pool``) as overrides keyed by config field; flags
    left unset (``None``) or absent from the command are left out. ``--pool cls`` also asks for a
    class token and ``--pool gap`` for none, as the pooling needs."""
    arch = {field: v for dest, field in ARCH_FLAGS.items() if (v := getattr(args, dest, None)) is not None}
    pool = getattr(args, "pool", None)
    if pool:
        arch.update(pool=pool, class_token=pool == "cls")
    posemb = getattr(args, "posemb", None)
    if posemb:
        arch["posemb"] = posemb
    return arch


def add_device_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--device``, resolved by :func:`vitlab.devices.resolve_device`."""
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def add_model_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """A required ``--model`` that :func:`resolve_model` reads."""
    p.add_argument("--model", required=True, help=MODEL_HELP)


def resolve_model(spec: str, *, img_size: int | None = None) -> tuple[Any, Path | None]:
    """``(model in eval mode, folder it came from or None)`` for a ``--model`` value.

    A folder holding ``model/`` (the output of ``vitlab train --out``) loads that
    sub-folder; an existing path goes to :func:`vitlab.load`; otherwise a registered
    name gives a randomly initialised model, and anything else goes to :func:`vitlab.load`.
    """
    from ..checkpoints import load
    from ..checkpoints.native import is_native
    from ..errors import UnknownModelError, VitlabError
    from ..models import create_model, list_models
    from ..models.registry import resolve_name

    overrides = {"img_size": img_size} if img_size else {}
    path = Path(spec)
    if path.exists():
        if path.is_dir() and not is_native(path) and is_native(path / "model"):
            return load(path / "model", **overrides).eval(), path
        return load(path, **overrides).eval(), path if path.is_dir() else None
    if resolve_name(spec) in list_models():
        return create_model(spec, **overrides).eval(), None
    try:
        return load(spec, **overrides).eval(), None
    except VitlabError as e:
        close = difflib.get_close_matches(resolve_name(spec), list_models(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UnknownModelError(
            f"--model {spec!r}: not a registered name, an existing path, or a loadable checkpoint; {hint}({e})"
        ) from None


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """``obj`` as indented JSON in ``path`` (its folder made when missing); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(obj, indent=2) + "\n")
    return out
