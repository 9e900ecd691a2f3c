"""Config files (big_vision's configs, timm's ``-c config.yaml``): ``vitlab train --config FILE`` (YAML or JSON),
with the command line's flags over the file's values, and the ``config.yaml`` every run writes: what it was asked
(:func:`config_values`), never what it chose (its ``sizing.json``, :mod:`vitlab.train.sizing`). ``vitlab train
--config runs/X/config.yaml --out runs/Y`` asks for run X again, and reads X's choices back from the ``sizing.json``
beside the file (the same recipe, side, batch, threads and steps: on one process the same weights); with
``--replan`` it chooses afresh on this machine, as X did.

A config file is data, never code: read only when it is a regular file of at most :data:`MAX_BYTES`, parsed by
PyYAML's safe loader (no anchors or aliases, at most :data:`MAX_DEPTH` levels) or ``json``; every key is an
option's config path (``data``, ``recipe.lr``, ``arch.embed_dim``: :data:`~vitlab.train.conf.options.OPTIONS`), and
every value is read by the option's kind, as its flag's text would be. An unknown key is a one-line error naming
the closest one; so is a value the option cannot take, naming the file and the key."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..._fs import NotAFile, TooLarge, read_small
from ...errors import ConfigError
from .options import OPTIONS, OptionError, flag_for, option
from .train_config import TrainConfig

__all__ = ["MAX_BYTES", "MAX_DEPTH", "Sources", "config_text", "config_values", "merge", "read_config_file"]

MAX_BYTES = 1 << 20
"""The largest config file read (1 MiB: a run's config.yaml is about 3 KiB)."""
MAX_DEPTH = 8
"""The deepest nesting of mappings and lists read (a config is three levels deep: ``recipe.res_schedule[i]``)."""
NESTED = ("recipe", "arch")
"""The top-level keys whose mapping holds options (``recipe: {lr: ...}`` is ``recipe.lr``)."""
_WRITTEN = [o.path for o in OPTIONS if o.path and o.file and o.resume != "process" and "." not in o.path]
"""The top-level options ``config.yaml`` may hold: all but what describes the process (``out``, ``workers``,
``stop_after``, ``progress``, ``memory_budget``) and what a file may not set (``allow_pipe``)."""
_DEFAULTS = {k: option(k).default if option(k).default is not None else getattr(TrainConfig(), k) for k in _WRITTEN}
"""The options' defaults (the command line's, else the configuration's): an option at its default is not written
in ``config.yaml`` (it was not asked)."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases (a few lines of them can stand for billions of values),
    with :data:`MAX_DEPTH` levels at most, and refusing a key set twice in one mapping (PyYAML keeps the last
    silently: which of two values a run used would be a guess)."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent) or getattr(self.peek_event(), "anchor", None):
            raise yaml.YAMLError("anchors and aliases (& and *) are not read in a config file")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                if key in lines:
                    raise yaml.YAMLError(_twice(key, lines[key], line))
                lines[key] = line
            except TypeError:  # an unhashable key: the base class says so
                break
        return super().construct_mapping(node, deep=deep)


def _twice(key: Any, first: int | None = None, second: int | None = None) -> str:
    where = f" (lines {first} and {second})" if first is not None else ""
    return f"{key} is set twice in one mapping{where}: a config says each option once"


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members, refusing a key given twice (``json`` keeps the last silently)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(_twice(key))
        seen[key] = value
    return seen


def _depth(v: Any, level: int = 1) -> int:
    if isinstance(v, Mapping):
        return max((_depth(x, level + 1) for x in v.values()), default=level)
    if isinstance(v, list):
        return max((_depth(x, level + 1) for x in v), default=level)
    return level


def _parse(path: Path) -> Any:
    """The file's contents (bounded: a regular file, :data:`MAX_BYTES` at most)."""
    try:
        text = read_small(path, limit=MAX_BYTES).decode("utf-8")
    except NotAFile:
        raise ConfigError(f"{path}: not a regular file; give a YAML or JSON config file") from None
    except TooLarge as e:
        raise ConfigError(f"{path}: {e.size:,} bytes, more than a config file's {MAX_BYTES:,}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; give a YAML or JSON config file") from None
    try:
        if path.suffix.lower() == ".json":
            doc = json.loads(text, object_pairs_hook=_unique)
            if _depth(doc) > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
            return doc
        return yaml.load(text, Loader=_Loader)
    except (ValueError, RecursionError, yaml.YAMLError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{path}: not a readable {'JSON' if path.suffix.lower() == '.json' else 'YAML'} config "
                          f"({first})") from None  # fmt: skip


def _closest(key: str, known: list[str]) -> str:
    """``"; did you mean recipe.lr?"`` for an unknown ``key``, or ``""``."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    last = key.rpartition(".")[2]
    close = close or [k for k in known if k.rpartition(".")[2] == last][:1]
    return f"; did you mean {close[0]}?" if close else ""


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The option values a config file sets, by config path, each read by its option's kind."""
    p = Path(path)
    doc = _parse(p)
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise ConfigError(
            f"{p}: expected a mapping of options (data: ..., recipe: {{lr: ...}}), got {type(doc).__name__}"
        )
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if key in NESTED and isinstance(value, Mapping):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[str(key)] = value
    known = [o.path for o in OPTIONS if o.path is not None]
    values = {}
    flat.pop("resolved", None)  # a config.yaml from before sizing.json: its record of the fitted recipe, not an option
    for key, value in flat.items():
        if key not in known:
            raise ConfigError(f"{p}: {key}: unknown key{_closest(key, known)}")
        row = option(key)
        if not row.file:
            raise ConfigError(f"{p}: {key}: not read from a config file; give {row.flag} on the command line")
        try:
            values[key] = row.from_file(value)
        except OptionError as e:
            raise ConfigError(f"{p}: {e.render(str)}") from None
    return values


@dataclass
class Sources:
    """Where the options' values came from: the config ``file`` (None: none) set ``from_file``, the command line
    the rest. :meth:`explain` names an option as the user gave it: a flag, or the file's key."""

    file: str | None = None
    from_file: set[str] = field(default_factory=set)

    def explain(self, e: OptionError) -> str:
        """``e``'s line: as is, or ``"{file}: recipe.lr: ..."`` when the option at fault came from the file."""
        if self.file is None or e.path not in self.from_file:
            return str(e)
        return f"{self.file}: " + e.render(lambda p: p if p in self.from_file else flag_for(p))


def merge(
    cli: Mapping[str, Any], typed: Collection[str], file: Mapping[str, Any], *, path: str
) -> tuple[dict[str, Any], set[str], Sources]:
    """The command line's values (``cli``; ``typed``: the paths whose flags were given) over a config file's
    (``file``, read from ``path``) over the command line's defaults: ``(values, paths given, sources)``. A flag
    given wins; the file's values count as given (fitting the recipe to the data keeps them)."""
    values = {**{k: v for k, v in cli.items() if k not in typed}, **file, **{k: cli[k] for k in typed if k in cli}}
    return values, set(typed) | set(file), Sources(file=path, from_file=set(file) - set(typed))


def _absolute(v: Any) -> Any:
    """A path that exists, made absolute (the run re-created from elsewhere reads the same files); else as is."""
    if isinstance(v, str) and v and Path(v).expanduser().exists():
        return str(Path(v).expanduser().resolve())
    return v


def _plain(v: Any) -> Any:
    """Tuples as lists (YAML's own sequences), recursively."""
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


def config_values(cfg: TrainConfig) -> dict[str, Any]:
    """What the run ``cfg`` was asked, as ``config.yaml`` holds it: the data (a path that exists, made absolute), every
    other option whose value is not its default (what describes the process left out), the recipe's name and the
    recipe fields the user set, the architecture options given. Read back, it asks for the same run (the same
    options, the same fields given, so the same fitting)."""
    d: dict[str, Any] = {}
    for key in _WRITTEN:
        value = getattr(cfg, key)
        if key == "data" or value != _DEFAULTS.get(key):
            d[key] = _absolute(value) if key in ("data", "init", "teacher", "cache_dir") else value
    fields = {f.name: getattr(cfg.recipe, f.name) for f in dataclasses.fields(cfg.recipe)}
    d["recipe"] = {"name": cfg.recipe.name, **{f: fields[f] for f in cfg.recipe_given if f in fields}}
    if cfg.arch:
        d["arch"] = dict(cfg.arch)
    return _plain(d)


def config_text(cfg: TrainConfig) -> str:
    """``config.yaml`` of the run ``cfg``: what it was asked (:func:`config_values`), what asks for it again."""
    head = (
        "# vitlab train --config <this file> --out <folder> asks for this run again: what it was asked. What it\n"
        "# chose (recipe fitted to the data, side, batch, threads, steps) is sizing.json beside it, which a run from\n"
        "# this file reads back: the same choices (--replan: measure afresh). Flags given with --config win.\n"
    )
    return head + yaml.safe_dump(config_values(cfg), sort_keys=False, default_flow_style=None, width=120,
                                 allow_unicode=True)  # fmt: skip
