"""Pieces several sub-commands share: the ``--device`` and ``--model`` options, resolving a model argument,
and writing a result as JSON. Import-light at module level, like every
``add_parser``: ``vitlab --help`` loads no torch."""

from __future__ import annotations

import argparse
import difflib
import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "DEVICE_HELP",
    "MODEL_HELP",
    "add_device_arg",
    "add_model_arg",
    "add_serving_args",
    "close_names",
    "default_output",
    "resolve_model",
    "write_json",
]

DEVICE_HELP = "auto (cuda when available, else cpu), cpu, cuda, cuda:1 ..."
MODEL_HELP = (
    "a model folder, a run folder (`vitlab train --out`), a checkpoint file, a public name "
    "(augreg_in21k/vit_b16) or a registered name (vit_ti16: random weights)"
)


def add_device_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--device``, resolved by :func:`vitlab.devices.resolve_device`."""
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def add_model_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """A required ``--model`` that :func:`resolve_model` reads."""
    p.add_argument("--model", required=True, help=MODEL_HELP)


def add_serving_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--tome`` and ``--trust-torchscript``: how ``predict`` and ``eval`` run a model or an exported folder."""
    p.add_argument(
        "--tome",
        type=int,
        default=None,
        metavar="R",
        help="token merging: R patch tokens merged per block (an exported folder keeps its own)",
    )
    p.add_argument(
        "--trust-torchscript",
        action="store_true",
        help="run a TorchScript export (loading it runs the code in the file: only for files you trust)",
    )


def resolve_model(
    spec: str,
    *,
    img_size: int | None = None,
    fast: bool = False,
    exported: bool = False,
    trust_torchscript: bool = False,
) -> tuple[Any, Path | None]:
    """``(model in eval mode, folder it came from or None)`` for a model argument: the one rule every
    command (``eval``, ``predict``, ``inspect``, ``fewshot``, ``export``; ``convert`` and ``finetune
    --init`` through :func:`vitlab.load`) follows.

    In order: an existing path is read by :func:`vitlab.load` (a model folder, a run folder
    -- ``vitlab train --out``, whose ``model/`` is loaded --, a Hugging Face folder or a checkpoint
    file); a registered architecture name (``vit_ti16``) gives a randomly initialised model; anything
    else is a public name for :func:`vitlab.load` (``augreg_in21k/vit_b16``). ``fast``: with the speed
    paths of :mod:`vitlab.accel` (eval, predict, few-shot features); otherwise the plain reference
    model (the analyses of ``inspect``, ``export``'s traced graph).
    The folder is the path given when it is one (outputs go there: :func:`default_output`).

    An exported folder (``vitlab export``) is served only where ``exported`` (``predict``, ``eval``): a
    :class:`vitlab.deploy.ExportedModel` with the folder's preprocessing config; TorchScript only with
    ``trust_torchscript``. Elsewhere it is an error naming the folder.
    """
    from ..checkpoints import load
    from ..errors import ConfigError, UnknownModelError, VitlabError
    from ..models import create_model, list_models
    from ..models.registry import resolve_name

    def ready(model: Any) -> Any:
        if fast:
            from ..accel import accelerate

            model = accelerate(model)
        return model.eval()

    overrides = {"img_size": img_size} if img_size else {}
    path = Path(spec)
    if path.exists():
        from ..deploy.folder import is_exported

        if is_exported(path):
            if not exported:
                raise ConfigError(
                    f"--model {spec}: an exported folder (vitlab export) serves predict and eval only; "
                    "give the vitlab model it was exported from"
                )
            from ..deploy import open_exported

            return open_exported(path, trust_torchscript=trust_torchscript), path
        return ready(load(path, **overrides)), path if path.is_dir() else None
    if resolve_name(spec) in list_models():
        return ready(create_model(spec, **overrides)), None
    try:
        return ready(load(spec, **overrides)), None
    except VitlabError as e:
        raise UnknownModelError(
            f"--model {spec!r}: not a registered name, an existing path, or a loadable checkpoint{close_names(spec)} "
            f"({e})"
        ) from None


def close_names(spec: str) -> str:
    """``"; did you mean vit_ti16, vit_ti8?"`` for a model name close to registered ones, else ``""``."""
    from ..models import list_models
    from ..models.registry import resolve_name

    close = difflib.get_close_matches(resolve_name(spec), list_models(), n=3, cutoff=0.5)
    return f"; did you mean {', '.join(close)}?" if close else ""


def default_output(spec: str, filename: str) -> Path | None:
    """Where a command writes ``filename`` when no output is given: next to the model, never in the
    current folder. A folder (model or run folder) -> inside it; a checkpoint file -> beside it; a
    name (nothing on disk) -> None: the command then prints without writing (or asks for a path)."""
    path = Path(spec)
    if path.is_dir():
        return path / filename
    if path.exists():
        return path.parent / filename
    return None


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """``obj`` as indented JSON in ``path`` (its folder made when missing), through a temporary file renamed over
    it (:func:`vitlab._fs.atomic_write_text`: a link at ``path`` is replaced, never written through); returns the
    path."""
    from .._fs import atomic_write_text, output_error

    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(out, e) from None
    atomic_write_text(out, json.dumps(obj, indent=2) + "\n")
    return out
