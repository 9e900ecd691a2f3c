"""The trackers of :mod:`vitlab.track`, one class per backend. Each optional library is imported in
its tracker's constructor, never at module import.

- :class:`CsvTracker`: ``<out>/scalars.csv``, one header row (``step`` then every scalar in the order
  first seen), one row per ``log``; a scalar first seen later rewrites the file with the wider header.
- :class:`TensorBoardTracker`: event files under ``<out>/tensorboard`` (``torch.utils.tensorboard``).
- :class:`WandbTracker`: a Weights & Biases run under ``<out>/wandb``; offline unless an API key is found
  (``WANDB_API_KEY`` or the ``~/.netrc`` entry ``wandb login`` writes); ``WANDB_MODE`` overrides.
- :class:`MlflowTracker`: an MLflow run in a local file store ``<out>/mlruns`` (plain files, which the
  light ``mlflow-skinny`` client can write), or wherever ``MLFLOW_TRACKING_URI`` points.
"""

from __future__ import annotations

import csv
import importlib
import json
import netrc
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO
from urllib.parse import urlparse

from .._fs import atomic_write_text, open_append, output_error, own_folder, refuse_folder, replacing
from ..errors import ConfigError

__all__ = ["CsvTracker", "MlflowTracker", "TensorBoardTracker", "WandbTracker", "check_settings", "make", "server"]

_MAX_HEADER = 1 << 20
"""The longest header line a ``scalars.csv`` vitlab wrote may have (a million characters)."""


def _require(module: str, *, logger: str, package: str) -> ModuleType:
    """Import ``module`` for ``--log logger``, or one line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(
            f"--log {logger}: the {package} package is not installed ({e}); pip install 'vitlab[{logger}]'"
        ) from None


def _scalars(scalars: Mapping[str, Any]) -> dict[str, float]:
    """``scalars`` with string keys and float values (ints, bools, NumPy and 0-d torch numbers alike)."""
    return {str(k): float(v) for k, v in scalars.items()}


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``a.b.c`` keys (lists and other values are kept whole)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr)


def _json(config: Mapping[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True, default=str)


# -- csv -----------------------------------------------------------------------------------------------


class CsvTracker:
    """Scalars as one CSV table, ``<out>/scalars.csv``, and the configuration as ``<out>/scalars_config.json``.

    Column order is stable: ``step``, then each scalar in the order it was first logged. A scalar first
    seen after rows were written widens the header: the file is rewritten (through a temporary file and a
    rename) with empty cells for the rows before. An existing file (a resumed run) is appended to, its
    columns kept; one that vitlab did not write (no ``step`` first in its header) is refused, not touched. Nothing
    is written through a link: a link named ``scalars.csv`` (or ``scalars_config.json``) is replaced by a file of
    its own (holding the rows it pointed to), and a folder of that name is refused in one line.
    """

    logger = "csv"

    def __init__(self, *, out: Path, filename: str = "scalars.csv") -> None:
        self.path = Path(out) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        refuse_folder(self.path)
        refuse_folder(self._config_path)
        self.columns: list[str] = self._read_header()
        self._file: TextIO | None = None

    def _read_header(self) -> list[str]:
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return []
        with self.path.open(newline="", encoding="utf-8", errors="replace") as f:
            line = f.readline(_MAX_HEADER)
        header = next(csv.reader([line]), [])
        if not header or header[0] != "step" or not line.endswith("\n"):
            raise ConfigError(
                f"{self.path}: not a scalars table vitlab wrote (its first line is not a 'step,...' header); "
                "move it away or log to another folder"
            )
        return header[1:]

    @property
    def _config_path(self) -> Path:
        return self.path.parent / f"{self.path.stem}_config.json"

    def _handle(self) -> TextIO:
        if self._file is None:
            self._file = open_append(self.path)
        return self._file

    def _rewrite(self, columns: list[str]) -> None:
        """Write the file again with the header ``step, *columns``, old rows padded with empty cells."""
        if self._file is not None:
            self._file.close()
            self._file = None
        with replacing(self.path) as tmp, tmp.open("w", newline="", encoding="utf-8") as dst:
            w = csv.writer(dst)
            w.writerow(["step", *columns])
            if self.path.is_file():
                with self.path.open(newline="", encoding="utf-8", errors="replace") as src:
                    rows = csv.reader(src)
                    next(rows, None)
                    for row in rows:
                        w.writerow(row + [""] * (len(columns) + 1 - len(row)))
        self.columns = columns

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        row = _scalars(scalars)
        new = [k for k in row if k not in self.columns]
        if new or not self.path.is_file():
            self._rewrite(self.columns + new)
        f = self._handle()
        try:
            csv.writer(f).writerow([int(step)] + [repr(row[k]) if k in row else "" for k in self.columns])
            f.flush()
        except OSError as e:  # a full disk: one line, the rows before are kept
            raise output_error(self.path, e, kept="the rows before are kept") from None

    def log_config(self, config: Mapping[str, Any]) -> None:
        atomic_write_text(self._config_path, _json(config) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# -- TensorBoard ---------------------------------------------------------------------------------------


class TensorBoardTracker:
    """Event files under ``<out>/tensorboard``: one scalar series per name (``/`` groups them in the UI),
    the configuration as the text summary ``config``. ``tensorboard --logdir <out>/tensorboard`` shows them."""

    logger = "tensorboard"

    def __init__(self, *, out: Path) -> None:
        _require("tensorboard", logger="tensorboard", package="tensorboard")
        writer_mod = _require("torch.utils.tensorboard", logger="tensorboard", package="tensorboard")
        self.log_dir = own_folder(Path(out) / "tensorboard", what="TensorBoard's event files", log=_note)
        self.writer = writer_mod.SummaryWriter(log_dir=str(self.log_dir))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for k, v in _scalars(scalars).items():
            self.writer.add_scalar(k, v, global_step=int(step))
        self.writer.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = "\n".join("    " + line for line in _json(config).splitlines())  # a Markdown code block
        self.writer.add_text("config", text, global_step=0)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


# -- Weights & Biases ----------------------------------------------------------------------------------


def _wandb_key_found() -> bool:
    """Whether W&B would find an API key: ``WANDB_API_KEY``, or a ``~/.netrc`` (``$NETRC``) entry for its
    host (``WANDB_BASE_URL``, by default api.wandb.ai), as ``wandb login`` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        entry = netrc.netrc(os.environ.get("NETRC") or None).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def wandb_mode() -> str:
    """``WANDB_MODE`` when set (``online``, ``offline``, ``disabled``), else ``online`` if an API key is
    found and ``offline`` if not: a run never stops to ask for a login, and ``wandb sync <out>/wandb/...``
    uploads an offline run later."""
    return os.environ.get("WANDB_MODE") or ("online" if _wandb_key_found() else "offline")


_WANDB_PROJECT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
"""A W&B project name vitlab passes on: up to 128 letters, digits, ``_``, ``-`` and ``.``, not starting with a dot.
W&B's own rule refuses ``/ \\ # ? % :``; a name is never a path (``../../etc``)."""


def wandb_project() -> str:
    """``$WANDB_PROJECT`` (or ``vitlab``), checked: a :class:`ConfigError` line for a name that is no project name."""
    name = os.environ.get("WANDB_PROJECT") or "vitlab"
    if not _WANDB_PROJECT.fullmatch(name) or ".." in name:
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise ConfigError(
            f"--log wandb: WANDB_PROJECT {shown!r} is not a project name (up to 128 letters, digits, '_', '-' and "
            "'.', not starting with '.'; a project name is not a path)"
        )
    return name


def _public(uri: str) -> str:
    """``uri`` as a line may print it: without the user name and password a URL may carry, at most 120 characters."""
    try:
        parts = urlparse(uri)
        if parts.hostname is not None and "@" in parts.netloc:
            host = parts.hostname + (f":{parts.port}" if parts.port else "")
            uri = parts._replace(netloc=host).geturl()
    except ValueError:  # a port that is no number: the text before any '@' only
        uri = uri.rpartition("@")[2]
    return uri if len(uri) <= 120 else uri[:117] + "..."


def server(name: str) -> str | None:
    """The server the tracker ``name`` talks to, as it may be printed (None: it writes local files only): MLflow's
    ``MLFLOW_TRACKING_URI`` unless a local store (a path, ``file:``, ``sqlite:``); W&B's ``WANDB_BASE_URL`` (or
    api.wandb.ai) when it runs online (:func:`wandb_mode`)."""
    if name == "mlflow":
        uri = os.environ.get("MLFLOW_TRACKING_URI") or ""
        scheme = urlparse(uri).scheme.lower()
        return None if len(scheme) <= 1 or scheme in ("file", "sqlite") else _public(uri)
    if name == "wandb" and wandb_mode() == "online":
        return _public(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    return None


def check_settings(name: str) -> None:
    """Refuse what the environment sets for the tracker ``name`` that it cannot use (a W&B project name that is no
    name), in one :class:`ConfigError` line, before a run reads its data."""
    if name == "wandb":
        wandb_project()


class WandbTracker:
    """A W&B run whose files live under ``<out>/wandb``; project ``$WANDB_PROJECT`` or ``vitlab`` (checked:
    :func:`wandb_project`), run name the run folder's. Scalars are logged with ``step``; the console is left alone
    (``console="off"``)."""

    logger = "wandb"

    def __init__(self, *, out: Path) -> None:
        wandb = _require("wandb", logger="wandb", package="wandb")
        project = wandb_project()
        folder = Path(out)
        own_folder(folder / "wandb", what="the W&B run's files", log=_note)  # wandb writes in <out>/wandb
        self.mode = wandb_mode()
        self.run = wandb.init(
            project=project,
            name=folder.resolve().name,
            dir=str(folder),
            mode=self.mode,
            settings=wandb.Settings(console="off"),
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(_scalars(scalars), step=int(step))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


# -- MLflow --------------------------------------------------------------------------------------------

_MLFLOW_BATCH = 100
"""Metrics and params per ``log_batch`` call (MLflow allows 1000 metrics, 100 params)."""
_MLFLOW_PARAM_LEN = 6000
"""MLflow's longest parameter value; longer ones are cut, with an ellipsis."""


def _mlflow_key(key: str) -> str:
    """A metric or param name MLflow accepts: letters, digits and ``_-./ `` (others become ``_``), <= 250."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)[:250] or "_"


class MlflowTracker:
    """An MLflow run (experiment ``$MLFLOW_EXPERIMENT_NAME`` or ``vitlab``, run name the run folder's) in
    the store at ``MLFLOW_TRACKING_URI``, or in a local file store ``<out>/mlruns`` when it is unset
    (``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri <out>/mlruns`` shows it). The
    configuration becomes the run's params, nested keys joined with dots.

    MLflow 3 keeps its file store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is
    true; choosing that store, this tracker sets the variable for its process when it is unset (an explicit
    ``false`` is kept, and the refusal becomes one line asking for a ``MLFLOW_TRACKING_URI``)."""

    logger = "mlflow"

    def __init__(self, *, out: Path) -> None:
        _require("mlflow", logger="mlflow", package="mlflow")
        tracking = _require("mlflow.tracking", logger="mlflow", package="mlflow")
        self._entities = _require("mlflow.entities", logger="mlflow", package="mlflow")
        refused = _require("mlflow.exceptions", logger="mlflow", package="mlflow").MlflowException
        folder = Path(out)
        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or ""
        if not self.uri:
            self.uri = own_folder(folder / "mlruns", what="MLflow's file store", log=_note).resolve().as_uri()
            if not os.environ.get("MLFLOW_ALLOW_FILE_STORE"):
                os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        try:
            self.client = tracking.MlflowClient(tracking_uri=self.uri)
            self._start(folder)
        except refused as e:
            first = (str(e).splitlines() or [type(e).__name__])[0].split(". ")[0]
            raise ConfigError(
                f"--log mlflow: {_public(self.uri)}: {first[:300]} (set MLFLOW_TRACKING_URI to a store MLflow accepts, "
                "e.g. sqlite:///mlflow.db with the full mlflow package)"
            ) from None

    def _start(self, folder: Path) -> None:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "vitlab"
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(exp_id, run_name=folder.resolve().name).info.run_id
        self._params: set[str] = set()

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        metric = self._entities.Metric
        items = [metric(_mlflow_key(k), v, now, int(step)) for k, v in _scalars(scalars).items()]
        for i in range(0, len(items), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i : i + _MLFLOW_BATCH])

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Params are write-once in MLflow: a key already logged by this tracker is not sent again."""
        param = self._entities.Param
        items = []
        for k, v in _flatten(config).items():
            key = _mlflow_key(k)
            if key in self._params:
                continue
            text = v if isinstance(v, str) else json.dumps(v, default=str)
            if len(text) > _MLFLOW_PARAM_LEN:
                text = text[: _MLFLOW_PARAM_LEN - 3] + "..."
            items.append(param(key, text))
            self._params.add(key)
        for i in range(0, len(items), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + _MLFLOW_BATCH])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


_CLASSES = {"csv": CsvTracker, "tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


def make(name: str, *, out: Path) -> Any:
    """A new tracker of the backend ``name`` writing under ``out``."""
    if name not in _CLASSES:
        raise ConfigError(f"--log: unknown logger {name!r}; choose from {', '.join(_CLASSES)}")
    return _CLASSES[name](out=out)
