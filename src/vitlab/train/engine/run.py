"""``fit``: one training run, top to bottom (nanoGPT's ``train.py``): the saved run to resume -> the checks -> the
``--init`` checkpoint and the teacher -> the process group, the folder's lock and claim -> the data, stored for the
side the sizing chooses -> what the run gets (:func:`vitlab.train.sizing.choose`: the recipe, the architecture, the
memory, the threads) -> the objective -> the model -> the loaders -> the plan (:func:`vitlab.train.sizing.plan`) ->
the optimiser -> the position -> the :class:`~vitlab.train.engine.trainer.Trainer` -> the summary.

The run's config (:class:`~vitlab.train.conf.train_config.TrainConfig`) is read, never rewritten: it is what the user
asked for; what the run chose is its :class:`~vitlab.train.sizing.Sizing`, passed beside it.

Outputs under ``out``: ``metrics.jsonl``, ``summary.json``, ``curves.png``, ``confusion.png``, ``health.png`` (the
attention health, :mod:`.watch`), what ``--log`` asks for (:mod:`vitlab.track`), ``model/`` (vitlab
folder: best or last weights, class names, preprocessing), ``config.yaml`` (what was asked), ``sizing.json`` (what
was chosen) and ``last.pt`` (everything needed to resume: model, optimizer, scheduler, scaler, EMA, RNG states, epoch
and step, the run's configuration and sizing)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch

from ..._fs import FolderLock
from ..._text import shown_lines
from ...data.shards.stream import StreamData
from ...data.sources import DataSource
from ...distributed import Dist, barrier, setup, teardown
from ...errors import CheckpointError, ConfigError, VitlabError
from ...track import check_trackers
from ..conf.config_file import config_values
from ..conf.phases import check_res_sizes
from ..conf.resume import resumed_config, trained_recipe
from ..conf.rules import validate
from ..conf.train_config import TrainConfig
from ..objectives import build_objective, objective_for
from ..objectives.distill import load_teacher
from ..persist.claim import claim_run_folder
from ..persist.outputs import read_summary, truncate_metrics
from ..persist.position import RunPosition
from ..persist.saver import CheckpointSaver
from ..persist.state import read_resume_state
from ..sizing import Here, Sizing, choose, plan
from ..sizing.budget import Replanner
from ..sizing.memory import check_model_size
from ..sizing.steps import RunPlan
from .loaders import build_folder_loaders
from .model import InitModel, amp, build_net, run_model_config
from .navit import navit_loaders
from .optim import Optimization, build_optimization, build_optimizer
from .parallel import ddp_memory_hint, distribute, shard_line
from .run_data import load_run_data, run_data_fingerprint
from .schedule import StepSchedule
from .shards import build_shard_loaders
from .signals import StopSignals
from .trainer import Trainer

__all__ = ["fit", "prepare"]


def fit(
    cfg: TrainConfig, *, resume: bool = False, given: Collection[str] | None = None, overwrite: bool = False,
    replay: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train (or resume) one run; returns the summary (also written to ``out/summary.json``).

    ``given``: the options the user gave (flags or config paths); a resume compares them with the saved run
    (:func:`~vitlab.train.conf.resume.resumed_config`). ``replay``: what another run chose
    (:func:`vitlab.train.sizing.read_sizing` of the folder of a ``--config runs/X/config.yaml``), read back instead
    of measuring when this run asks for the same on the same data.

    ``summary["interrupted"]`` is True when the run stopped early (a stop signal: ``summary["signal"]``
    names it; ``stop_after``); ``last.pt`` then holds the exact position to continue from.

    The run folder is locked while the run writes it (:class:`~vitlab._fs.FolderLock`; rank 0 under
    torchrun). A new run into a folder that holds another run is refused unless ``overwrite``, which
    first removes the previous run's outputs (:func:`~vitlab.train.persist.claim.claim_run_folder`).
    A stop signal that arrives before training begins ends the run at once
    (:class:`~vitlab.train.engine.signals.StoppedBeforeTraining`).
    """
    if resume and overwrite:
        raise ConfigError("--overwrite and --resume exclude each other: one continues the run, the other replaces it")
    out = Path(cfg.out)
    state: dict[str, Any] | None = None
    saved: Sizing | None = None
    if resume:
        state = read_resume_state(out / "last.pt")
        cfg = resumed_config(state, cfg, flags=given, log=_say if os.environ.get("RANK", "0") == "0" else None)
        saved = _resumed_sizing(state)
    validate(cfg)
    source = DataSource.named(cfg.data)  # what --data names, told once (a run folder given as data refused here)
    if state is None:  # (a resumed run reads the data it was started with: a --data typed again is compared)
        source.check_out(out)  # an output folder is never read as data, nor written inside the data
    check_trackers(cfg.log)  # a missing logger library before any data is read
    init = InitModel.read(cfg)  # read once; its architecture checked against the options before any data
    teacher = load_teacher(cfg.teacher) if cfg.teacher else None  # before the data: its size counts in the memory
    d, device = setup(cfg.device, group=cfg.fsdp)
    try:
        with StopSignals(single_process=not d.enabled) as stop, contextlib.ExitStack() as held:
            if d.is_main:
                held.enter_context(FolderLock(out))
                if state is None:
                    claim_run_folder(out, overwrite=overwrite, init=cfg.init, log=_say)
            trainer = prepare(
                cfg, source, state=state, saved=saved, replay=replay, init=init, teacher=teacher, dist=d,
                device=device, out=out, stop=stop,
            )  # fmt: skip
            summary = _finished(trainer)  # a finished run resumed: its outputs stay as they are
            if summary is None:
                summary = trainer.run()
        barrier(d)  # no process tears its group down while another still writes its results or talks to it
        return summary
    finally:
        teardown()


def _say(*parts: Any, **kw: Any) -> None:
    """A run's line on the terminal, with what it quotes from files (class names, paths) shown escaped."""
    print(*(shown_lines(p) for p in parts), **kw)


def _finished(trainer: Trainer) -> dict[str, Any] | None:
    """The summary of a resumed run with nothing left to train (at the end of its plan, after a ``--epochs`` given
    again re-planned it; its checkpoint and data checked as every resume's are), read back as the run wrote it: its
    summary, figures, configuration and ``model/`` are not written again. None when steps are left, or when the run
    ended before writing its summary (resuming then writes it)."""
    p = trainer.position
    if not trainer.resumed or not trainer.plan.done(step=p.step, epoch=p.epoch):
        return None
    return read_summary(trainer.out)


def _resumed_sizing(state: dict[str, Any]) -> Sizing:
    """What the saved run chose (``last.pt``'s sizing; one from before the sizing room kept the fitted recipe and its
    line in its configuration). Its threads and workers are chosen again: the machine may be another."""
    if isinstance(state.get("sizing"), str):
        return Sizing.from_dict(json.loads(state["sizing"]))
    old = json.loads(state["config"])
    return Sizing(recipe=trained_recipe(state), chosen=old.get("resolved"))


def _replayed(
    replay: dict[str, Any] | None, cfg: TrainConfig, fingerprint: dict[str, Any] | None, log: Callable[..., None]
) -> Sizing | None:
    """What another run chose, when this run asks for the same (``config.yaml``'s values) on the same data (its
    fingerprint) on one process; else None, with a line saying why the choices are made afresh."""
    if replay is None:
        return None
    where = replay["where"]
    asked = config_values(cfg)
    differs = sorted(k for k in {*asked, *replay["config"]} if asked.get(k) != replay["config"].get(k))
    if differs:
        log(f"{where}: this run is asked otherwise ({', '.join(differs)}): its choices are made afresh")
        return None
    if replay["fingerprint"] != fingerprint:
        log(f"{where}: the data changed since that run: its choices are made afresh")
        return None
    return dataclasses.replace(replay["sizing"], replayed=where)


def prepare(
    cfg: TrainConfig,
    source: DataSource,
    *,
    state: dict[str, Any] | None,
    init: InitModel | None,
    dist: Dist,
    device: torch.device,
    out: Path,
    stop: StopSignals | None = None,
    saved: Sizing | None = None,
    replay: dict[str, Any] | None = None,
    teacher: torch.nn.Module | None = None,
) -> Trainer:
    """Everything before the first step, in order (see the module's notes); ``state``: the read ``last.pt`` of a
    resumed run, ``saved``: its sizing (kept, with its plan); ``source``: what the run's ``--data`` names."""
    t_start = time.perf_counter()
    log: Callable[..., None] = _say if dist.is_main else (lambda *a, **k: None)
    amp_dtype, use_scaler = amp(cfg.precision, device)
    here = Here(dist=dist, device=device, amp_dtype=amp_dtype, t_start=t_start, optimizer=build_optimizer)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
    kind = objective_for(cfg)
    check_model_size(cfg, dist=dist, device=device)  # by arithmetic: a model too big for memory before its data
    # -- the data, stored for the side the sizing's rule chooses -------------------------------------------------
    fingerprint = run_data_fingerprint(cfg, source, state=state, log=log)  # resumed: the data must be unchanged
    if saved is None and not dist.enabled:
        saved = _replayed(replay, cfg, fingerprint, log)
    data = load_run_data(cfg, here, source=source, out=out, log=log, labels=kind.uses_labels,
                         init=init.config if init is not None else None,
                         teacher=teacher.config if teacher is not None else None,
                         storage=saved.storage if saved is not None else None)  # fmt: skip
    # -- what the run gets here: measured, then chosen ---------------------------------------------------------
    num_classes = kind.head(data)[0]
    sizing = choose(
        cfg, data=data, here=here, num_classes=num_classes, init=init.config if init is not None else None,
        teacher=teacher.config if teacher is not None else None, saved=saved, resumed=state is not None, log=log,
        architecture=lambda recipe: run_model_config(cfg, recipe, data, objective=kind, init=init),
    )  # fmt: skip
    recipe = sizing.recipe
    objective = build_objective(cfg, recipe, data, device=device, teacher=teacher)
    if line := objective.start_line():
        log(line)
    # -- the model, the loaders ------------------------------------------------------------------------------------
    net, init_line = build_net(cfg, sizing, data, objective=objective, init=init, dist=dist, device=device)
    vit = objective.exported(net)
    build = build_shard_loaders if isinstance(data, StreamData) else build_folder_loaders
    loaders = build(cfg, sizing, data=data, model_config=vit.config, dist=dist, device=device,
                    labels=objective.uses_labels)  # fmt: skip
    if cfg.pack:  # packed training batches around the square loaders (their centre-crop evaluation, their epochs)
        loaders = navit_loaders(cfg, sizing, square=loaders, data=data, model=vit, dist=dist)
    if recipe.res_schedule:  # before the plan: one-line errors, and the probe then times the final size
        mc = vit.config
        check_res_sizes(recipe.res_schedule, final=mc.img_size, multiple=mc.patch_size * mc.stem_stride,
                        dynamic_pad=mc.dynamic_img_pad)  # fmt: skip
    train_net = distribute(net, cfg, recipe, dist=dist, device=device, amp_dtype=amp_dtype, blocks=list(vit.blocks),
                           unused=objective.leaves_parameters_unused)  # fmt: skip
    _log_parallelism(cfg, net, dist=dist, device=device, amp_dtype=amp_dtype, blocks=len(vit.blocks), log=log)
    # -- the plan, the optimiser, the position ---------------------------------------------------------------------
    if state is not None:  # a resumed run keeps its plan
        run_plan, replan = RunPlan.from_dict(state["plan"]), Replanner()
        sizing = dataclasses.replace(sizing, plan=sizing.plan or run_plan)
    else:
        sizing, replan = plan(sizing, cfg, here=here, net=net, run_net=train_net, loaders=loaders, objective=objective,
                              replans=replay["replans"] if sizing.replayed and replay else (), log=log)  # fmt: skip
        run_plan = sizing.plan  # type: ignore[assignment]
    lr = recipe.scaled_lr(recipe.batch_size)
    schedule = StepSchedule(recipe)
    schedule.stretch(run_plan.total_steps, warmup_steps=run_plan.warmup_steps)
    opt = build_optimization(net, recipe=recipe, lr=lr, device=device, use_scaler=use_scaler,
                             lr_factor=schedule.lr)  # fmt: skip
    saver = CheckpointSaver(out, dist=dist, device=device, sharded=cfg.fsdp, log=log)
    position = _start_position(state, saver=saver, net=net, opt=opt, generator=loaders.generator, plan=run_plan,
                               schedule=schedule, dist=dist, out=out, log=log)  # fmt: skip
    return Trainer(
        cfg=cfg, sizing=sizing, dist=dist, device=device, out=out, data=data, objective=objective, net=net,
        train_net=train_net, loaders=loaders, opt=opt, schedule=schedule, plan=run_plan, replan=replan,
        position=position, saver=saver, amp_dtype=amp_dtype, stop=stop, log=log, t_start=t_start,
        data_fingerprint=fingerprint, init_line=init_line, resumed=state is not None,
    )  # fmt: skip


def _log_parallelism(
    cfg: TrainConfig, net: torch.nn.Module, *, dist: Dist, device: torch.device, amp_dtype: torch.dtype | None,
    blocks: int, log: Callable[..., None],
) -> None:  # fmt: skip
    """What ``--fsdp`` sharded; under DDP on GPUs, a hint to shard when the model's states fill the devices."""
    if cfg.fsdp:
        log(shard_line(net, dist, device=device, amp_dtype=amp_dtype, blocks=blocks))
    elif dist.enabled and device.type == "cuda":
        params = sum(p.numel() for p in net.parameters())
        memory = torch.cuda.get_device_properties(device).total_memory
        if hint := ddp_memory_hint(params, world_size=dist.world_size, device_memory=memory):
            log(hint)


def _start_position(
    state: dict[str, Any] | None, *, saver: CheckpointSaver, net: torch.nn.Module, opt: Optimization,
    generator: torch.Generator, plan: RunPlan, schedule: StepSchedule, dist: Dist, out: Path,
    log: Callable[..., None],
) -> RunPosition:  # fmt: skip
    """Where the run starts: at the beginning (``state`` is None: ``out/metrics.jsonl`` is cleared), or where the
    checkpoint ``state`` left it (:meth:`~vitlab.train.persist.saver.CheckpointSaver.restore`), keeping the
    ``metrics.jsonl`` rows of the epochs it had finished."""
    if state is None:
        if dist.is_main:
            (out / "metrics.jsonl").unlink(missing_ok=True)
        return RunPosition()
    try:
        p = saver.restore(state, net=net, opt=opt, generator=generator)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:  # weights of another model, a torn state
        if isinstance(e, VitlabError):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise CheckpointError(
            f"{out / 'last.pt'}: its weights or optimizer state do not fit the run it describes ({type(e).__name__}: "
            f"{first}); start a new run (--overwrite)"
        ) from None
    schedule.stretch(plan.total_steps, warmup_steps=plan.warmup_steps)  # the saved length, or the one --epochs set
    if dist.is_main:
        truncate_metrics(out / "metrics.jsonl", last_epoch=p.epoch)
    if plan.done(step=p.step, epoch=p.epoch):
        log(f"{out}: the run is already complete ({p.step} steps); nothing to resume")
    else:
        log(f"resuming {out} at epoch {p.epoch + 1}, step {p.step}/{plan.total_steps}")
    return p
