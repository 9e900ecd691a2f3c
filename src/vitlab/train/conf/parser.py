"""The argparse options of ``vitlab train`` and ``vitlab finetune``, generated from the option table
(:data:`~vitlab.train.conf.options.OPTIONS`), and the option values a parsed command line gives, keyed by
config path (:func:`namespace_values`), with the ones the user actually typed (``--resume`` compares those
with the saved run; fitting the recipe to the data keeps them)."""

from __future__ import annotations

import argparse
from typing import Any

from .options import FLAG, OPTIONS, Option
from .recipes import RECIPES
from .train_config import TrainConfig, arch_values, build_config

__all__ = ["GROUPS", "add_options", "arch_overrides", "config_from_args", "dest", "namespace_values"]


GROUPS = {
    "data": "data",
    "model": "model (defaults: the recipe's)",
    "recipe": "recipe (each flag overrides the recipe's value)",
    "distillation": "distillation (DeiT, Touvron et al. 2021)",
    "run": "run",
}
"""The ``--help`` group of an option's row (:attr:`~.options.Option.group`) -> its title, in the order they are
printed."""


class _NoteGiven(argparse.Action):
    """Mixed into the parser's actions by :func:`_note_given_flags`: remembers the option's flag."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        namespace.given_flags = frozenset(getattr(namespace, "given_flags", ())) | {self.option_strings[0]}
        super().__call__(parser, namespace, values, option_string)


def _note_given_flags(p: argparse.ArgumentParser) -> None:
    """Make the options added to ``p`` from now on record their flag in ``args.given_flags`` when they
    appear on the command line: argparse calls an action only for an option that is given; defaults are set
    without it."""
    for name in (None, "store", "store_true", "append"):
        base = p._registry_get("action", name, None)
        p.register("action", name, type(f"Noted{base.__name__}", (_NoteGiven, base), {}))


def dest(row: Option) -> str:
    """The namespace attribute argparse stores the option in (``--no-progress`` -> ``no_progress``)."""
    return row.flag.lstrip("-").replace("-", "_")  # type: ignore[union-attr]


def add_options(p: argparse.ArgumentParser, *, command: str) -> None:
    """Every option of ``command`` (``train`` or ``finetune``), in the table's order and ``--help`` groups. A
    recipe's field defaults to None: the recipe's value."""
    _note_given_flags(p)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for row in OPTIONS:
        if row.flag is None or command not in row.commands:
            continue
        where = (
            p
            if row.group is None
            else groups.get(row.group) or groups.setdefault(row.group, p.add_argument_group(GROUPS[row.group]))
        )
        kw: dict[str, Any] = {"help": row.help, "default": row.command_default.get(command, row.default)}
        if row.kind is FLAG:
            kw["action"] = "store_true"
        else:
            kw.update(type=row.kind.parse, metavar=row.metavar, **({"action": "append"} if row.repeat else {}))
            kw["choices"] = list(RECIPES) if row.path == "recipe.name" else row.choices
        if row.required:
            kw["required"] = True
        where.add_argument(row.flag, *row.aliases, **kw)


def namespace_values(args: argparse.Namespace, *, command: str) -> tuple[dict[str, Any], set[str]]:
    """``(values, given)``: the option values of the parsed ``args`` by config path, and the paths whose flag the
    user gave. A top-level option has its value (the default when not given); a recipe's or the model's only
    when given (None otherwise: the recipe's value stands)."""
    flags = set(getattr(args, "given_flags", ()))
    values: dict[str, Any] = {}
    given: set[str] = set()
    for row in OPTIONS:
        if row.path is None or row.flag is None or command not in row.commands or not hasattr(args, dest(row)):
            continue
        raw = getattr(args, dest(row))
        typed = row.flag in flags
        if row.path.startswith(("recipe.", "arch.")) and not typed and (raw is None or row.command_default):
            continue
        values[row.path] = row.value(raw)
        if typed:
            given.add(row.path)
    return values, given


def _command(args: argparse.Namespace) -> str:
    return getattr(args, "command", None) or ("finetune" if hasattr(args, "init") else "train")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The configuration the parsed command line ``args`` describes (no config file)."""
    values, given = namespace_values(args, command=_command(args))
    return build_config(values, given=given)


def arch_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The architecture flags given in ``args`` (``--patch-size``, ``--dim`` ...) as model fields
    (:func:`~vitlab.train.conf.train_config.arch_values`); flags left unset or absent from the command are left out."""
    return arch_values(namespace_values(args, command=_command(args))[0])
