"""``fit``: one training run, top to bottom (nanoGPT's ``train.py``): the saved run to resume -> the checks -> the
``--init`` checkpoint -> the process group, the folder's lock and claim -> the data -> the recipe fitted to it ->
the objective -> the memory -> the model -> the loaders -> the plan -> the optimiser -> the position -> the
:class:`~vitlab.train.engine.trainer.Trainer` -> the summary.

Outputs under ``out``: ``metrics.jsonl``, ``summary.json``, ``curves.png``, ``confusion.png``, ``health.png`` (the
attention health, :mod:`.watch`), what ``--log`` asks for (:mod:`vitlab.track`), ``model/`` (vitlab
folder: best or last weights, class names, preprocessing) and ``last.pt`` (everything needed to resume: model,
optimizer, scheduler, scaler, EMA, RNG states, epoch and step, the run's configuration)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch

from ..._fs import FolderLock
from ..._text import shown_lines
from ...data.stream import StreamData
from ...distributed import Dist, barrier, setup, teardown
from ...errors import CheckpointError, ConfigError, VitlabError
from ...track import check_trackers
from ..objectives import Objective, build_objective, objective_for
from ..persist.claim import claim_run_folder
from ..persist.outputs import truncate_metrics
from ..persist.position import RunPlan, RunPosition
from ..persist.saver import CheckpointSaver
from ..persist.state import read_resume_state
from ..spec.config import TrainConfig
from ..spec.pace import Pace
from ..spec.pack import fit_pack
from ..spec.resume import resumed_config
from ..spec.rules import check_res_sizes, micro_batch, validate
from .budget import Replanner, plan_run
from .calibrate import budget_passes, measure_pace, wants_budget_size, wants_pace
from .cores import threads_line
from .data import load_run_data, run_data_fingerprint
from .loaders import build_folder_loaders
from .memory import check_model_size, fit_memory
from .model import InitModel, amp, build_net, planned_config
from .optim import Optimization, build_optimization
from .packs import packed_loaders
from .parallel import ddp_memory_hint, distribute, shard_line
from .schedule import StepSchedule
from .shards import build_shard_loaders
from .signals import StopSignals
from .trainer import Trainer

__all__ = ["fit", "prepare"]


def fit(
    cfg: TrainConfig, *, resume: bool = False, given: Collection[str] | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Train (or resume) one run; returns the summary (also written to ``out/summary.json``).

    ``given``: the options the user gave (flags or config paths); a resume compares them with the saved run
    (:func:`~vitlab.train.spec.resume.resumed_config`).

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
    if resume:
        state = read_resume_state(out / "last.pt")
        cfg = resumed_config(state, cfg, flags=given, log=_say if os.environ.get("RANK", "0") == "0" else None)
    validate(cfg)
    check_trackers(cfg.log)  # a missing logger library before any data is read
    init = InitModel.read(cfg)  # read once; its architecture checked against the options before any data
    d, device = setup(cfg.device, group=cfg.fsdp)
    try:
        with StopSignals(single_process=not d.enabled) as stop, contextlib.ExitStack() as held:
            if d.is_main:
                held.enter_context(FolderLock(out))
                if state is None:
                    claim_run_folder(out, overwrite=overwrite, init=cfg.init, log=_say)
            summary = prepare(cfg, state=state, init=init, dist=d, device=device, out=out, stop=stop).run()
        barrier(d)  # no process tears its group down while another still writes its results or talks to it
        return summary
    finally:
        teardown()


def _say(*parts: Any, **kw: Any) -> None:
    """A run's line on the terminal, with what it quotes from files (class names, paths) shown escaped."""
    print(*(shown_lines(p) for p in parts), **kw)


def prepare(
    cfg: TrainConfig,
    *,
    state: dict[str, Any] | None,
    init: InitModel | None,
    dist: Dist,
    device: torch.device,
    out: Path,
    stop: StopSignals | None = None,
) -> Trainer:
    """Everything before the first step, in order (see the module's notes); ``state``: the read ``last.pt`` of a
    resumed run (which keeps its fitted recipe and its plan)."""
    t_start = time.perf_counter()
    log: Callable[..., None] = _say if dist.is_main else (lambda *a, **k: None)
    amp_dtype, use_scaler = amp(cfg.precision, device)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
    check_model_size(cfg, dist=dist, device=device)  # by arithmetic: a model too big for memory before its data
    # -- the data, the recipe fitted to it, the objective ------------------------------------------------------
    fingerprint = run_data_fingerprint(cfg, state=state, log=log)  # resumed: the data must be unchanged
    cfg, data, objective, pace = _data_and_objective(
        cfg, fitted=state is not None, init=init, dist=dist, device=device, amp_dtype=amp_dtype, t_start=t_start,
        out=out, log=log,
    )  # fmt: skip
    # -- the model, its memory first -----------------------------------------------------------------------------
    teacher = getattr(objective, "teacher", None)
    memory = fit_memory(
        cfg, model_config=planned_config(cfg, data, objective=objective, init=init), dist=dist, device=device,
        num_classes=objective.head(data)[0], teacher=teacher.config if teacher is not None else None,
        resumed=state is not None, log=log,
    )  # fmt: skip
    cfg = memory.cfg
    net, workers, init_line = build_net(cfg, data, objective=objective, init=init, dist=dist, device=device)
    vit = objective.exported(net)
    micro = micro_batch(cfg.recipe.batch_size, world_size=dist.world_size, accum_steps=cfg.recipe.accum_steps)
    if line := threads_line(cfg, device=device, workers=workers, step_macs=vit.macs() * micro * 3):
        log(line)
    build = build_shard_loaders if isinstance(data, StreamData) else build_folder_loaders
    loaders = build(
        cfg, data=data, model_config=vit.config, dist=dist, device=device, workers=workers,
        eval_batch=memory.eval_batch, labels=objective.uses_labels,
    )  # fmt: skip
    if cfg.pack:  # packed training batches around the square loaders (their centre-crop evaluation, their epochs)
        loaders = packed_loaders(cfg, square=loaders, data=data, model=vit, dist=dist, workers=workers)
    if cfg.recipe.res_schedule:  # before the plan: one-line errors, and the probe then times the final size
        mc = vit.config
        check_res_sizes(cfg.recipe.res_schedule, final=mc.img_size, multiple=mc.patch_size * mc.stem_stride,
                        dynamic_pad=mc.dynamic_img_pad)  # fmt: skip
    train_net = distribute(net, cfg, dist=dist, device=device, amp_dtype=amp_dtype, blocks=list(vit.blocks),
                           unused=objective.leaves_parameters_unused)  # fmt: skip
    _log_parallelism(cfg, net, dist=dist, device=device, amp_dtype=amp_dtype, blocks=len(vit.blocks), log=log)
    # -- the plan, the optimiser, the position ---------------------------------------------------------------------
    schedule = StepSchedule(cfg.recipe)
    lr = cfg.recipe.scaled_lr(cfg.recipe.batch_size)
    if state is not None:  # a resumed run keeps its plan
        plan, replan = RunPlan.from_dict(state["plan"]), Replanner()
    else:
        plan, replan = plan_run(
            cfg, net=net, run_net=train_net, loaders=loaders, objective=objective, schedule=schedule, lr=lr,
            dist=dist, device=device, amp_dtype=amp_dtype, t_start=t_start, log=log, pace=pace,
        )  # fmt: skip
    schedule.refit(plan.total_steps, warmup_steps=plan.warmup_steps)
    opt = build_optimization(net, recipe=cfg.recipe, lr=lr, device=device, use_scaler=use_scaler,
                             lr_factor=schedule.lr)  # fmt: skip
    saver = CheckpointSaver(out, dist=dist, device=device, sharded=cfg.fsdp, log=log)
    position = _start_position(state, saver=saver, net=net, opt=opt, generator=loaders.generator, plan=plan,
                               schedule=schedule, dist=dist, out=out, log=log)  # fmt: skip
    return Trainer(
        cfg=cfg, dist=dist, device=device, out=out, data=data, objective=objective, net=net, train_net=train_net,
        loaders=loaders, opt=opt, schedule=schedule, plan=plan, replan=replan, position=position, saver=saver,
        amp_dtype=amp_dtype, stop=stop, log=log, t_start=t_start, data_fingerprint=fingerprint, init_line=init_line,
        resumed=state is not None,
    )  # fmt: skip


def _data_and_objective(
    cfg: TrainConfig, *, fitted: bool, init: InitModel | None, dist: Dist, device: torch.device,
    amp_dtype: torch.dtype | None, t_start: float, out: Path, log: Callable[..., None],
) -> tuple[TrainConfig, Any, Objective, Pace | None]:  # fmt: skip
    """``(cfg, data, objective, pace)``: the run's data, the recipe fitted to it (unless ``fitted``: a resumed run
    keeps its own; with ``init``, to fine-tuning that model; a time-budgeted ``auto`` recipe for a fresh model is
    chosen from a pace measured on the data first, :func:`~vitlab.train.engine.calibrate.measure_pace`, else ``pace``
    is None; its photos' size from timed steps before they are decoded, :func:`~.calibrate.budget_passes`) and the
    objective (a teacher is loaded now: in memory when the memory is measured)."""
    kind = objective_for(cfg)
    side = init.config.img_size[0] if init is not None and init.config.img_size[0] == init.config.img_size[1] else None
    passes = None
    if not fitted and wants_budget_size(cfg, uses_labels=kind.uses_labels, dist=dist):
        passes = budget_passes(cfg, device=device, amp_dtype=amp_dtype, t_start=t_start)
    data = load_run_data(cfg, dist=dist, out=out, log=log, labels=kind.uses_labels, init_size=side, passes=passes)
    pace = None
    if not fitted:
        if wants_pace(cfg, data, uses_labels=kind.uses_labels, dist=dist):
            pace = measure_pace(cfg, data, device=device, amp_dtype=amp_dtype, t_start=t_start)
        mcfg = init.config if init is not None else None
        cfg = kind.fit_recipe(cfg, data, device_type=device.type, pace=pace, init=mcfg, processes=dist.world_size)
        if cfg.resolved:
            log(cfg.resolved)
        cfg = fit_pack(cfg, log=log)
    objective = build_objective(cfg, data, device=device)
    if line := objective.start_line():
        log(line)
    return cfg, data, objective, pace


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
    schedule.refit(plan.total_steps, warmup_steps=plan.warmup_steps)  # the saved length, or the one --epochs set
    if dist.is_main:
        truncate_metrics(out / "metrics.jsonl", last_epoch=p.epoch)
    if p.step >= plan.total_steps or p.epoch >= plan.epochs:
        log(f"{out}: the run is already complete ({p.step} steps); nothing to resume")
    else:
        log(f"resuming {out} at epoch {p.epoch + 1}, step {p.step}/{plan.total_steps}")
    return p
