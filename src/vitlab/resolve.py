"""The one rule for a model argument: what ``--model``, ``--teacher``, ``--init`` and ``vitlab.resolve_model`` take,
and what a model records that commands default to (the data it was trained on).

In order, a model argument is:

1. an existing path: a vitlab model folder (``runs/X/model``); a **run folder** (``vitlab train --out``: a folder
   holding ``model/`` or ``last.pt``), which means its ``model/`` and nothing else in it (an export written into
   the run folder is not served in its place: the run's weights move on with every resume, an export does not);
   a ``vitlab export`` folder (served where the caller serves exports, ``predict`` and ``eval``; elsewhere
   refused); a Hugging Face folder or a checkpoint file (:func:`vitlab.load` reads them);
2. a registered architecture (``vit_ti16``): random weights, refused where a trained model is needed
   (distillation's teacher, ``--init``);
3. anything else: a public name (``augreg_in21k/vit_b16``) for :func:`vitlab.load`.

Every command (``eval``, ``predict``, ``inspect``, ``fewshot``, ``export``, ``plan``, ``bench``), distillation's teacher
(:func:`vitlab.train.objectives.distill.load_teacher`) and fine-tuning's ``--init``
(:class:`vitlab.train.engine.model.InitModel`) go through :func:`model_source`, so one argument means one model
everywhere, and a refusal reads the same whichever option it came by. A refusal is a :class:`ModelArgError` (or
:class:`~vitlab.errors.UnknownModelError`) whose ``problem`` is the text after ``<option> <argument>:``, so the
training options can name the flag as the user gave it (a config file's key).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError, ConfigError, DataError, OfflineError, UnknownModelError, VitlabError

if TYPE_CHECKING:
    from torch import nn

    from .checkpoints import Checkpoint
    from .models import ViTConfig

__all__ = [
    "ModelArgError",
    "ModelSource",
    "check_finite",
    "is_run_folder",
    "model_source",
    "open_model",
    "read_model",
    "recorded_data",
    "resolve_model",
    "source_config",
]

TRAINED_KINDS = "a run or model folder, a checkpoint file or a public name"


class ModelArgError(ConfigError):
    """A model argument refused by the rule; ``problem``: the text after ``<option> <argument>:``."""


def _refuse(option: str, spec: str, problem: str, *, cls: type[VitlabError] = ModelArgError) -> VitlabError:
    e = cls(f"{option} {spec}: {problem}")
    e.option, e.problem = option, problem  # type: ignore[attr-defined]
    return e


@dataclass(frozen=True)
class ModelSource:
    """What a model argument names, decided without reading any weights.

    ``kind``: ``run`` (a run folder: ``path`` is its ``model/``), ``folder`` (a model, Hugging Face or snapshot
    folder), ``file`` (a checkpoint file), ``export`` (a ``vitlab export`` folder), ``architecture`` (a registered
    name: random weights) or ``public`` (a public name, downloaded when first used). ``path``: what is read (None
    for a name). ``folder``: where a command writes its outputs by default (the folder given: a run folder, a model
    folder; None for a file or a name). ``notes``: what the caller should tell the user (one line each)."""

    spec: str
    kind: str
    path: Path | None = None
    folder: Path | None = None
    notes: tuple[str, ...] = ()

    @property
    def trained(self) -> bool:
        """Whether the argument names trained weights (anything but a registered architecture)."""
        return self.kind != "architecture"


def is_run_folder(path: str | os.PathLike[str]) -> bool:
    """A folder ``vitlab train --out`` wrote: it holds ``model/`` or ``last.pt`` (and is no model folder itself)."""
    from .checkpoints.vitlab_folder import is_native

    p = Path(path)
    return p.is_dir() and not is_native(p) and ((p / "model").is_dir() or (p / "last.pt").is_file())


def model_source(
    spec: str | os.PathLike[str], *, option: str = "--model", exported: bool = False, trained: bool = False
) -> ModelSource:
    """What the model argument ``spec`` names, by the rule of this module (nothing is loaded).

    ``exported``: a ``vitlab export`` folder is served (``predict``, ``eval``); otherwise it is refused in one line.
    ``trained``: a registered architecture (random weights) is refused (a teacher, an ``--init`` model).
    ``option`` names the argument in refusals (``--model``, ``--teacher``, ``--init``)."""
    from .deploy.folder import is_exported
    from .models import list_models
    from .models.registry import resolve_name

    text = os.fspath(spec)
    path = Path(text)
    if path.exists():
        if path.is_dir() and is_run_folder(path):
            model = path / "model"
            if not model.is_dir():
                raise _refuse(
                    option,
                    text,
                    "a run folder without model/ yet (the run writes it at its first evaluation); wait for it, or "
                    "give a model folder",
                )
            notes = ()
            if is_exported(path):
                notes = (
                    f"{text} holds an export (config.json) beside the run's model/: {option} {text} means the "
                    "run's model/, whose weights follow the run; export into a folder of its own to serve the "
                    "export",
                )
            return ModelSource(text, "run", model, path, notes)
        if path.is_dir() and is_exported(path):
            if not exported:
                raise _refuse(
                    option,
                    text,
                    "an exported folder (vitlab export) serves predict and eval only; give the vitlab model it was "
                    "exported from",
                )
            return ModelSource(text, "export", path, path)
        if path.is_dir():
            return ModelSource(text, "folder", path, path)
        return ModelSource(text, "file", path)
    if resolve_name(text) in list_models():
        if trained:
            raise _refuse(option, text, f"a registered name is an untrained architecture; {_weights_for(text)}")
        return ModelSource(text, "architecture")
    return ModelSource(text, "public")


def _weights_for(name: str) -> str:
    """What to give instead of an architecture's name where trained weights are needed: its public weights by
    name when some are known (what timm's ``pretrained=True`` loads for it), and any trained model."""
    from .checkpoints import hub

    try:
        public = hub.pretrained_name(name)
    except CheckpointError:
        return f"give a trained model ({TRAINED_KINDS})"
    return f"its public weights are {public} (downloaded when online), or give a trained model ({TRAINED_KINDS})"


def _unknown(option: str, spec: str, e: VitlabError) -> VitlabError:
    """The refusal of a name that is neither a path nor a registered architecture, ``e`` what reading it raised. A
    public checkpoint's name is refused for its own reason (not downloaded: an :class:`~vitlab.errors.OfflineError`
    saying what to fetch and where), never as an unknown name; any other name with the close registered and public
    names."""
    from .checkpoints import hub
    from .models.variants import close_names

    if hub.is_hub_name(spec):
        why = str(e).removeprefix(f"{spec}: ")
        return _refuse(option, spec, why, cls=OfflineError if isinstance(e, OfflineError) else CheckpointError)
    close = [*close_names(spec), *hub.close_names(spec)]
    hint = f"; did you mean {', '.join(close)}?" if close else "; `vitlab models` lists the names"
    return _refuse(
        option,
        repr(spec),
        f"not a registered name, an existing path, or a public checkpoint's name{hint}",
        cls=UnknownModelError,
    )


def read_model(source: ModelSource, *, option: str = "--model") -> Checkpoint:
    """The checkpoint ``source`` names, read once (a run folder's ``model/``; a public name downloaded), for a
    caller that adapts the model before building it (fine-tuning's ``--init``). A registered architecture or an
    export has no checkpoint: refused in one line."""
    from .checkpoints import read_checkpoint

    if source.kind in ("architecture", "export"):
        what = "an untrained architecture" if source.kind == "architecture" else "an exported folder (vitlab export)"
        raise _refuse(option, source.spec, f"{what} has no checkpoint to read; give a trained model ({TRAINED_KINDS})")
    try:
        ckpt = read_checkpoint(source.path if source.path is not None else source.spec)
    except VitlabError as e:
        if source.kind == "public":
            raise _unknown(option, source.spec, e) from None
        raise
    check_finite(ckpt.state, spec=source.spec, option=option)
    return ckpt


def open_model(
    source: ModelSource,
    *,
    img_size: int | None = None,
    fast: bool = False,
    trust_torchscript: bool = False,
    option: str = "--model",
    note: Callable[[str], None] | None = None,
) -> Any:
    """The model ``source`` names, in eval mode: an export folder through :func:`vitlab.deploy.open_exported`
    (TorchScript only with ``trust_torchscript``), a registered architecture with random weights, anything else
    through :func:`vitlab.checkpoints.load`. ``fast``: with the speed paths of :mod:`vitlab.accel` (evaluation,
    prediction, features, a teacher); otherwise the plain reference model (``inspect``'s analyses, ``export``'s
    traced graph). ``img_size``: another input resolution (position embeddings resampled).

    Without ``img_size``, a Hugging Face folder whose image processor crops to a smaller side than its position
    table's (:attr:`~vitlab.models.ViTConfig.processor_side`: DINOv2's 224 px, its table made for 518) is served at
    that side, as Hugging Face's pipeline feeds it, its table resampled as Hugging Face resamples it (the same
    features; at 518 px a forward costs 5.3x the tokens); ``note`` is told so in one line."""
    from .checkpoints import load
    from .models import create_model

    def ready(model: Any) -> Any:
        fed = model.config.processor_side if img_size is None else None
        if fed is not None:
            table = model.config.img_size[0]
            model.set_input_size(fed)
            if note is not None:
                note(
                    f"{source.spec}: served at {fed} px, the side its Hugging Face image processor crops to, "
                    f"as Hugging Face's pipeline feeds it; its {table}-px position table "
                    f"resampled as Hugging Face resamples it (--img-size {table} where a command takes it)"
                )
        if fast:
            from .accel import accelerate

            model = accelerate(model)
        return model.eval()

    overrides = {"img_size": img_size} if img_size else {}
    if source.kind == "export":
        from .deploy import open_exported

        return open_exported(source.path, trust_torchscript=trust_torchscript)  # type: ignore[arg-type]
    if source.kind == "architecture":
        return ready(create_model(source.spec, **overrides))
    if source.kind == "public":
        try:
            return ready(load(source.spec, **overrides))
        except VitlabError as e:
            raise _unknown(option, source.spec, e) from None
    return ready(load(source.path, **overrides))  # type: ignore[arg-type]


def resolve_model(
    spec: str | os.PathLike[str],
    *,
    img_size: int | None = None,
    fast: bool = False,
    exported: bool = False,
    trust_torchscript: bool = False,
    trained: bool = False,
    finite: bool = False,
    option: str = "--model",
) -> Any:
    """The model a model argument names, by the one rule (:func:`model_source`, then :func:`open_model`), in eval
    mode. ``finite``: a model whose weights hold NaN or infinite values is refused in one line
    (:func:`check_finite`). The other keywords are those of the two functions."""
    source = model_source(spec, option=option, exported=exported, trained=trained)
    model = open_model(source, img_size=img_size, fast=fast, trust_torchscript=trust_torchscript, option=option)
    if finite:
        check_finite(model, spec=source.spec, option=option)
    return model


def source_config(source: ModelSource, *, option: str = "--model") -> ViTConfig:
    """The configuration of the model ``source`` names, with nothing allocated: a vitlab folder's (or a run
    folder's ``model/``) from its ``config.json`` alone, an export's from its config, a registered architecture's
    from the registry, any other checkpoint's from its file (shapes included); at the side :func:`open_model` serves
    it at. ``vitlab plan`` and ``vitlab bench`` read it."""
    from .checkpoints import checkpoint_config
    from .checkpoints.files import read_config_file
    from .checkpoints.vitlab_folder import CONFIG_NAME, config_from_record, is_native

    if source.kind == "architecture":
        import torch

        from .models import create_model

        with torch.device("meta"):
            return create_model(source.spec).config
    if source.kind == "export":
        from .deploy import exported_config

        return exported_config(source.path)  # type: ignore[arg-type]
    if source.path is not None and is_native(source.path):
        where = source.path / CONFIG_NAME
        config = config_from_record(read_config_file(where), where=str(where))
    else:
        config = checkpoint_config(read_model(source, option=option))
    fed = config.processor_side  # served at that side (:func:`open_model`)
    return config if fed is None else config.at_size(fed)


def check_finite(model: Any, *, spec: str, option: str = "--model") -> None:
    """Refuse a model (or a state dict) whose floating-point weights hold NaN or infinite values, in one line
    naming the first tensors: such a model's every output is NaN, and a command would report ``nan`` as a result
    or fail deep inside an analysis."""
    import torch

    if isinstance(model, dict):
        tensors = [(k, v) for k, v in model.items() if isinstance(v, torch.Tensor)]
    elif isinstance(model, torch.nn.Module):
        tensors = [*model.named_parameters(), *model.named_buffers()]
    else:
        return  # an exported graph: its outputs are checked where it runs
    bad = [k for k, v in tensors if v.is_floating_point() and v.device.type != "meta" and not bool(v.isfinite().all())]
    if bad:
        names = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise _refuse(
            option,
            spec,
            f"the weights hold NaN or infinite values ({names}); every output would be NaN (a diverged run: "
            "resume it from an earlier checkpoint or with a lower --lr)",
            cls=CheckpointError,
        )


def recorded_data(model: nn.Module, spec: str, *, ask: str) -> str:
    """The ``--data`` value for the data ``model`` was trained on, as its config records it (a run's ``model/``),
    usable from here: ``digits``, ``cifar10``/``cifar100``, tar shards as recorded, or an absolute folder that
    exists. Anything else is a :class:`~vitlab.errors.DataError` naming ``--data`` and ending with ``ask`` (what to
    pass instead): a folder that is gone, a relative path (it named a folder of the directory training ran in,
    which is not recorded), or no record at all. Never another data set in its place."""
    from ._text import shown
    from .data.sources import builtin_data

    recorded = (getattr(model.config, "extra", None) or {}).get("data")
    if not isinstance(recorded, str) or not recorded.strip():
        raise DataError(f"--data: {shown(spec)} records no training data; {ask}")
    text = shown(recorded if len(recorded) <= 200 else recorded[:197] + "...")
    where = f"{shown(spec)} was trained on '{text}'"
    name = builtin_data(recorded)
    if name is not None:
        return name
    from .data.shards.source import is_shard_spec

    if is_shard_spec(recorded):
        return recorded
    path = Path(recorded).expanduser()
    if not path.is_absolute():
        raise DataError(
            f"--data: {where}, a path relative to the folder training ran in, which the run does not record; {ask}"
        )
    if not path.is_dir():
        raise DataError(f"--data: {where}, which is not a folder here (moved or on another machine?); {ask}")
    return recorded
