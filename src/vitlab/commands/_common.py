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
    "model_data",
    "resolve_model",
    "trained_on",
    "write_json",
]

DEVICE_HELP = "auto (cuda when available, else cpu), cpu, cuda, cuda:1 ..."
MODEL_HELP = (
    "a model folder, a run folder (`vitlab train --out`), a checkpoint file, a public name "
    "(augreg_in21k/vit_b16) or a registered name (vit_ti16: random weights)"
)


def count(text: str) -> int:
    """argparse's ``type`` of a count option (``--batch-size``, ``--steps``): a whole number of at least 1, refused in
    one line at parsing, as ``vitlab train`` refuses its own (before: each command said it otherwise, or
    PyTorch's DataLoader did)."""
    digits = text.strip().removeprefix("+")
    if not digits.isdecimal() or int(digits) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return int(digits)


def add_device_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--device``, resolved by :func:`vitlab.devices.resolve_device`."""
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def add_progress_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--no-progress`` (``args.no_progress``), as ``vitlab train`` has it: the command's loops draw no bar and
    print no count lines (off a terminal they print plain lines, :mod:`vitlab._progress`); results still print."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar on the terminal, nor count lines off it")


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
    finite: bool = False,
) -> tuple[Any, Path | None]:
    """``(model in eval mode, folder it came from or None)`` for a ``--model`` argument, by the library's one rule
    (:mod:`vitlab.resolve`: a model folder, a run folder -- its ``model/``, never an export written beside it --, an
    export where ``exported``, a checkpoint file, a registered architecture, a public name). The rule's notes go to
    stderr, one line each. ``finite``: a model with NaN or infinite weights is refused in one line (``eval``,
    ``fewshot``, ``inspect``). The folder is the path given when it is one (outputs go there:
    :func:`default_output`)."""
    import sys

    from .._text import shown
    from ..resolve import check_finite, model_source, open_model

    source = model_source(spec, exported=exported)
    for note in source.notes:
        print(f"note: {shown(note)}", file=sys.stderr)
    model = open_model(source, img_size=img_size, fast=fast, trust_torchscript=trust_torchscript,
                       note=lambda line: print(f"note: {shown(line)}", file=sys.stderr))  # fmt: skip
    if finite:
        check_finite(model, spec=spec)
    return model, source.folder


def model_data(
    model: Any, spec: str, data: str | None, *, val_split: float | None = None, split: str = "val"
) -> tuple[str, float | None, list[str]]:
    """``(--data value, held-out fraction, notes)`` of a command that defaults to the model's own data (``eval``,
    ``fewshot``): ``data`` when given; else the data the model's run trained on (:func:`vitlab.resolve.recorded_data`:
    an error naming ``--data`` when that is gone); else, for a model that records no data (an architecture, a public
    checkpoint), the embedded digits. ``notes`` say which was taken. The folder the model's run trained on, when it
    has no ``val/``, is evaluated on the fraction the run held out (seed 0), the images that did not train it: the
    run's own number, never one over its training images."""
    from ..data.sources import DEFAULT_HOLD_OUT, DataSource, eval_split_dir
    from ..resolve import recorded_data

    notes = []
    if data is None:
        recorded = (getattr(model.config, "extra", None) or {}).get("data")
        if not isinstance(recorded, str) or not recorded.strip():
            note = f"no --data: {spec} records no training data; the embedded digits (--data digits)"
            return "digits", val_split, [note]
        data = recorded_data(model, spec, ask="pass --data with its location, or --data digits for the embedded digits")
        notes.append(f"no --data: {data}, the data {spec} was trained on (its config records it)")
    root = DataSource.named(data).folder  # (tar shards: None, they hold out shards)
    plain = root is not None and eval_split_dir(root) is None
    if val_split is None and split != "train" and plain and trained_on(model, data):
        saved = model.config.extra.get("val_split")
        val_split = saved if type(saved) is float and 0 < saved < 1 else DEFAULT_HOLD_OUT
    return data, val_split, notes


def trained_on(model: Any, data: str) -> bool:
    """Whether ``model``'s run trained on the folder ``data`` (its config records the folder's absolute path)."""
    recorded = (getattr(model.config, "extra", None) or {}).get("data")
    try:
        return isinstance(recorded, str) and Path(recorded).resolve() == Path(data).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False


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
