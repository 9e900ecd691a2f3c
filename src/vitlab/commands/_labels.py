"""The label part of ``vitlab data check DIR --labels --model M``: its options (:func:`add_label_args`) and what it
finds (:func:`run_label_check`: ``label_issue`` findings, :mod:`vitlab.evaluate.label_issues`), kept apart from the
rest of the check so that the check's command adds them with two calls. Import-light at module level, like every
``add_parser``: ``vitlab --help`` loads no torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import DEVICE_HELP, MODEL_HELP

__all__ = ["NEEDS_MODEL", "add_label_args", "label_lines", "run_label_check"]

NEEDS_MODEL = (
    "--labels: needs --model M (a run folder, a model folder, a checkpoint or a public name such as "
    "augreg_in21k/vit_b16) whose features rank the training images' labels"
)
"""The one line ``--labels`` without ``--model`` says."""


def add_label_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--labels``, ``--model``, ``--folds`` and ``--device`` of the label check."""
    p.add_argument(
        "--labels",
        action="store_true",
        help="also rank the training images whose given label the model's out-of-sample evidence contradicts most "
        "(confident learning on cross-validated linear probes over the model's frozen features); needs --model",
    )
    p.add_argument("--model", default=None, help=f"with --labels: {MODEL_HELP}")
    p.add_argument(
        "--folds",
        type=int,
        default=5,
        metavar="K",
        help="with --labels: K-fold cross-validation of the linear probes (default 5; seed 0)",
    )
    p.add_argument("--device", default="auto", help=f"with --labels: where the features are computed: {DEVICE_HELP}")


def run_label_check(args: argparse.Namespace, root: str | Path) -> list[dict[str, Any]]:
    """The ``label_issue`` findings of the folder ``root`` (paths relative to it, most suspect first) when
    ``args.labels``, else none. ``args`` holds :func:`add_label_args`' options; ``no_progress``, ``cache_dir`` and
    ``max_image_pixels`` are read when the command has them. Without ``--model``: one line saying what it needs
    (:data:`NEEDS_MODEL`, a :class:`~vitlab.errors.ConfigError`)."""
    from ..errors import ConfigError

    model_spec = getattr(args, "model", None)
    if not getattr(args, "labels", False):
        if model_spec is not None:
            raise ConfigError("--model: only with --labels (the model ranks the labels)")
        return []
    if model_spec is None:
        raise ConfigError(NEEDS_MODEL)
    folds = getattr(args, "folds", 5)
    if not isinstance(folds, int) or folds < 2:
        raise ConfigError(f"--folds {folds}: cross-validation needs 2 folds or more")

    import sys

    import vitlab

    from .._text import shown
    from ..devices import resolve_device
    from ..evaluate.label_issues import label_issue_findings

    device = resolve_device(getattr(args, "device", "auto"))
    model = vitlab.resolve_model(model_spec, fast=True, finite=True).to(device)
    return label_issue_findings(
        model,
        root,
        folds=folds,
        progress=not getattr(args, "no_progress", False),
        cache_dir=getattr(args, "cache_dir", None),
        max_pixels=getattr(args, "max_image_pixels", None),
        log=lambda line: print(shown(line), file=sys.stderr),
    )


def label_lines(findings: list[dict[str, Any]], *, limit: int = 20) -> list[str]:
    """The terminal's summary of the ``label_issue`` findings: how many, and the ``limit`` most suspect, one a line
    (names from files shown escaped)."""
    from .._text import shown

    issues = [f for f in findings if f.get("kind") == "label_issue"]
    if not issues:
        return ["label issues: none found (confident learning flags no image)"]
    lines = [f"label issues: {len(issues)} image(s) whose label the model's out-of-sample evidence contradicts; "
             "most suspect first (score: the probability of the given class)"]  # fmt: skip
    for f in issues[:limit]:
        lines.append(
            f"  {f['rank']:>4}. {shown(f['paths'][0])}: given {shown(f['given'])}, suggested {shown(f['suggested'])} "
            f"(score {f['score']:.3f}; {f['suggested_score']:.3f} for {shown(f['suggested'])})"
        )
    if len(issues) > limit:
        lines.append(f"  ... and {len(issues) - limit} more (--json lists them all)")
    return lines
