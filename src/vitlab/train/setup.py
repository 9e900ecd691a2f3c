"""How a training run is prepared, in one process: the data and its fingerprint, the recipe fitted to
the data, the model (and a teacher), loaders, the plan (``--time-budget``), the optimizer, and the
position to start from. :class:`~vitlab.train.trainer.Trainer` adds the loop."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import report
from .budget import Replanner, _plan_budget, make_plan
from .build import HeadWarmup, _amp, build_net, build_optimization, distribute, planned_config
from .checkpointing import start_position
from .config import TrainConfig
from .distributed import Dist
from .loaders import build_loaders, load_run_data, run_data_fingerprint
from .loop import StopSignals
from .memory import fit_memory
from .objectives import build_objective, objective_for
from .spec.rules import check_res_sizes as check_sizes
from .token_drop import ends_dropping

__all__ = ["TrainerSetup"]


class TrainerSetup:
    """The construction of a :class:`~vitlab.train.trainer.Trainer`: everything before the first step."""

    def __init__(
        self,
        *,
        cfg: TrainConfig,
        dist: Dist,
        device: torch.device,
        out: Path,
        state: dict[str, Any] | None = None,
        stop: StopSignals | None = None,
    ) -> None:
        self.cfg, self.dist, self.device, self.out = cfg, dist, device, out
        self.stop = stop
        self.t_start = time.perf_counter()
        self.log = print if dist.is_main else (lambda *a, **k: None)
        self.amp_dtype, use_scaler = _amp(cfg.precision, device)
        if dist.is_main:
            out.mkdir(parents=True, exist_ok=True)
        self.data_fingerprint = run_data_fingerprint(cfg, state=state, log=self.log)  # resumed: data unchanged
        kind = objective_for(cfg)
        self.data = load_run_data(cfg, dist=dist, out=out, log=self.log, labels=kind.uses_labels)
        if state is None:  # a resumed run keeps the recipe it was fitted to
            self.cfg = cfg = kind.fit_recipe(cfg, self.data, device_type=device.type)
            if cfg.resolved:
                self.log(cfg.resolved)
        # first: a teacher's weights are in memory when the memory is measured
        self.objective = build_objective(cfg, self.data, device=device)
        if line := self.objective.start_line():
            self.log(line)
        teacher = getattr(self.objective, "teacher", None)
        planned, init_model = planned_config(cfg, data=self.data, objective=self.objective)
        self.memory = fit_memory(  # before the model, the optimizer and the loaders allocate
            cfg,
            model_config=planned,
            dist=dist,
            device=device,
            num_classes=planned.num_classes,
            teacher=teacher.config if teacher is not None else None,
            resumed=state is not None,
            log=self.log,
        )
        self.cfg = cfg = self.memory.cfg
        self.model, self.net, workers = build_net(
            cfg, data=self.data, dist=dist, device=device, model=init_model, objective=self.objective
        )
        self.loaders = build_loaders(
            cfg,
            data=self.data,
            model_config=self.model.config,
            dist=dist,
            device=device,
            workers=workers,
            eval_batch=self.memory.eval_batch,
            labels=self.objective.uses_labels,
        )
        if cfg.recipe.res_schedule:  # before the plan: one-line errors, and the probe then times the final size
            mc = self.model.config
            check_sizes(
                cfg.recipe.res_schedule,
                final=mc.img_size,
                multiple=mc.patch_size * mc.stem_stride,
                dynamic_pad=mc.dynamic_img_pad,
            )
        self.run_model = distribute(
            self.net,
            cfg,
            dist=dist,
            device=device,
            amp_dtype=self.amp_dtype,
            blocks=list(self.model.blocks),
            unused=self.objective.leaves_parameters_unused,
        )
        if cfg.fsdp:
            from .fsdp import shard_line

            self.log(shard_line(self.net, dist, device=device, amp_dtype=self.amp_dtype, blocks=len(self.model.blocks)))
        elif dist.enabled and device.type == "cuda":
            from .fsdp import ddp_memory_hint

            params = sum(p.numel() for p in self.net.parameters())
            memory = torch.cuda.get_device_properties(device).total_memory
            if hint := ddp_memory_hint(params, world_size=dist.world_size, device_memory=memory):
                self.log(hint)
        self.lr = cfg.recipe.scaled_lr(cfg.recipe.batch_size)
        self.replan = Replanner()  # not due: resumed runs keep their plan
        if state is not None:
            self.plan: dict[str, Any] = dict(state["plan"])
        else:
            self.plan, self.replan = make_plan(
                cfg,
                loaders=self.loaders,
                net=self.net,
                run_model=self.run_model,
                device=device,
                amp_dtype=self.amp_dtype,
                t_start=self.t_start,
                dist=dist,
                log=self.log,
                lr=self.lr,
                objective=self.objective,
                measure=_plan_budget,  # read at call time: tests stand in for vitlab.train.setup._plan_budget
            )
            if cfg.recipe.res_schedule:  # the run's first steps are at the smaller sizes: no re-plan from their pace
                self.replan.due = self.replan.late = False
            if ends_dropping(cfg.recipe):
                self.replan.due = False  # its first steps drop tokens; the epoch-end cuts see the unmasked pace later
        self.opt = build_optimization(
            self.net,
            recipe=cfg.recipe,
            lr=self.lr,
            total_steps=self.plan["total_steps"],
            warmup_steps=self.plan["warmup_steps"],
            device=device,
            use_scaler=use_scaler,
        )
        self.eval_model = self.opt.ema.module if self.opt.ema is not None else self.net
        self.progress = start_position(
            state,
            net=self.net,
            opt=self.opt,
            generator=self.loaders.generator,
            dist=dist,
            out=out,
            plan=self.plan,
            log=self.log,
        )
        self.head_warmup = HeadWarmup.start(  # after the optimizer, which holds every parameter
            self.model, steps=cfg.recipe.head_warmup, step=self.progress.step, distributed=dist.enabled
        )
        self.last_eval: dict[str, Any] | None = None
        self.last_save = self.last_plot = time.perf_counter()
        if self.stop is not None:
            self.stop.training()  # ready: from now on a stop signal saves (the first step then stops)
        if getattr(self.model, "init_line", None):
            self.log(self.model.init_line)
            if state is None and self.objective.uses_labels:
                self.log(self._before_training_line())
        start = report.start_line(
            self.model, self.data, cfg.recipe, self.plan, self.lr, dist.world_size, device, time_budget=cfg.time_budget
        )
        self.log(start)
        self.eta = report.WallEstimate(
            total_steps=self.plan["total_steps"] if not cfg.time_budget else 0,  # a budgeted run knows its end
            steps_per_epoch=self.loaders.steps_per_epoch,
            batch_size=cfg.recipe.batch_size,
            n_eval=len(self.data.val),
        )

    def _before_training_line(self) -> str:
        """The started-from model's accuracy on the evaluation split at the new size, before any step
        (a collective under torchrun: every rank evaluates its shard)."""
        ev = self.objective.evaluate(
            self.eval_model, self._eval_batches(), device=self.device, amp_dtype=self.amp_dtype, dist=self.dist
        )
        h, w = self.model.config.img_size
        return f"before fine-tuning, at {h}x{w}: top-1 {100 * ev['top1']:.2f}% on {self.data.val_name}"

    def _eval_batches(self) -> Iterable[Any]:
        """This rank's evaluation batches; with ``--fsdp`` kept in step with the other ranks'
        (:func:`~vitlab.train.fsdp.lockstep`: every sharded forward is a collective)."""
        if not self.cfg.fsdp:
            return self.loaders.eval_loader
        from .fsdp import lockstep

        return lockstep(
            self.loaders.eval_loader,
            net=self.eval_model,
            d=self.dist,
            device=self.device,
            amp_dtype=self.amp_dtype,
            config=self.model.config,
        )

    def _exportable(self) -> nn.Module | None:
        """The model ``model/`` is written from: the trained ViT; with ``--fsdp`` its full weights gathered
        to rank 0 as a plain model (a collective; None on the other ranks)."""
        if not self.cfg.fsdp:
            return self.objective.exported(self.eval_model)
        from .fsdp import full_model

        return full_model(self.objective.exported(self.eval_model), self.dist)
