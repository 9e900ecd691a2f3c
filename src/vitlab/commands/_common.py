"""Pieces several sub-commands share: the architecture flags as model overrides, and the
``--device`` option. Import-light, like every ``add_parser``: ``vitlab --help`` loads no torch."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["ARCH_FLAGS", "DEVICE_HELP", "add_device_arg", "arch_overrides"]

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
