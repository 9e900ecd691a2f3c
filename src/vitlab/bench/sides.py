"""One side of a comparison: what to build (:class:`Side`), and building it into a step to time."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import create_model
from ..devices import autocast
from ..errors import ConfigError
from ..models import VisionTransformer, ViTConfig, count_macs
from .paths import inference_path, training_path
from .references import build_reference, is_plain_vit, plain_adamw, vitlab_optimizer
from .stats import sync

__all__ = ["COMPILE_MODES", "DTYPES", "MODES", "Built", "Side", "build_side"]

MODES = ("infer", "train")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Side:
    """One side of a comparison, everything needed to build and time it. Picklable: a
    :class:`~vitlab.bench.workers.WorkerProcess` sends it to a process of its own."""

    key: str
    """``"ours"`` (a vitlab model from the registry) or ``"ref"`` (:func:`build_reference` of ``vs``)."""
    model: str | ViTConfig
    """A registered model name, or a model's config (a trained model's architecture, as
    :func:`vitlab.resolve.source_config` reads it): built with random weights, as timing needs none. The reference
    copies the architecture."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """:class:`ViTConfig` fields, as ``create_model`` takes them."""
    mode: str = "infer"
    batch_size: int = 32
    num_classes: int | None = None
    """Classes of the head; None: the model's (1000 for a registered name)."""
    dtype: str = "float32"
    """A key of ``DTYPES``; other than float32 the step runs under autocast."""
    device: str = "cpu"
    vs: str | None = None
    compile: str | None = None
    """A ``torch.compile`` mode, or None for eager."""
    threads: int | None = None
    """``torch.set_num_threads`` of a worker process (an in-process side uses the caller's)."""
    seed: int = 0


@dataclass
class Built:
    """A built side: its step (None once sent back from a worker process) and what it reports."""

    step: Callable[[], None]
    params: int
    gflops_per_image: float
    """Forward GFLOPs per image the model executes (2 x multiply-accumulates)."""
    config: ViTConfig
    compile_seconds: float | None
    optimizer: str | None
    inference_path: str | None
    training_path: str | None


def build_side(side: Side, *, progress: bool = False) -> Built:
    """The model of ``side``, its inputs and its step (compiled and run once if asked)."""
    dev = torch.device(side.device)
    tdtype = DTYPES[side.dtype]
    autocast(dev, tdtype)  # a combination autocast cannot run raises ConfigError here, before any model
    with torch.device("meta"):  # the architecture only: no weights, no init
        probe = _ours(side)
    cfg: ViTConfig = probe.config  # type: ignore[assignment]
    if side.vs in ("timm", "hf") and not is_plain_vit(probe):
        raise ConfigError(
            f"--vs {side.vs}: {cfg.name} is not a plain ViT (hybrid stem or axial blocks); "
            f"only plain ViTs have a {side.vs} equivalent here"
        )
    torch.manual_seed(side.seed)
    model = (_ours(side) if side.key == "ours" else build_reference(side.vs or "vitlab", cfg)).to(dev)
    g = torch.Generator().manual_seed(side.seed + 1)  # the same images on both sides, in any process
    x = torch.randn(side.batch_size, cfg.in_chans, *cfg.img_size, generator=g).to(dev)
    y = torch.randint(0, max(cfg.num_classes, 1), (side.batch_size,), generator=g).to(dev)
    # an A/A run (--vs vitlab) trains both copies alike; timm and HF get AdamW as their users write it
    make_opt = vitlab_optimizer if side.key == "ours" or side.vs == "vitlab" else plain_adamw
    opt = make_opt(model) if side.mode == "train" else None
    target = torch.compile(model, mode=side.compile) if side.compile else model
    step = _make_step(target, side.mode, x, y, lambda: autocast(dev, tdtype), opt)  # type: ignore[arg-type]
    compile_s = None
    if side.compile:  # the first call compiles; time it on its own
        if progress:
            who = "vitlab" if side.key == "ours" else side.vs
            print(
                f"compiling {who} ({side.mode}) with torch.compile(mode={side.compile!r}) ...",
                file=sys.stderr,
                flush=True,
            )
        t0 = time.perf_counter()
        with _freezing(side.mode == "infer"):
            step()
        sync(dev)
        compile_s = time.perf_counter() - t0
    # what each model runs: ours count a hybrid's ResNet stem, and less for a class-token-only last block
    macs = model.macs(executed=True) if isinstance(model, VisionTransformer) else count_macs(cfg)
    eager_ours = side.key == "ours" and not side.compile and tdtype == torch.float32
    return Built(
        step=step,
        params=sum(p.numel() for p in model.parameters()),
        gflops_per_image=2 * macs / 1e9,
        config=cfg,
        compile_seconds=compile_s,
        optimizer=_describe(opt) if opt is not None else None,
        inference_path=inference_path(model, x) if eager_ours and side.mode == "infer" else None,
        training_path=training_path(model) if eager_ours and side.mode == "train" and dev.type == "cpu" else None,
    )


def _ours(side: Side) -> nn.Module:
    """Our model of ``side``, randomly initialised: a registered name through the registry, a config as itself, with
    the side's overrides either way. A new number of classes drops the config's class names (they no longer fit)."""
    if not isinstance(side.model, ViTConfig):
        return create_model(side.model, num_classes=side.num_classes, **side.overrides)
    changes = dict(side.overrides)
    if side.num_classes is not None and side.num_classes != side.model.num_classes:
        changes.update(num_classes=side.num_classes, class_names=None)
    return VisionTransformer(side.model.replace(**changes))


def _describe(opt: torch.optim.Optimizer) -> str:
    """``AdamW(fused)``: the optimizer's class and kernel."""
    d = opt.defaults
    impl = "fused" if d.get("fused") else "foreach" if d.get("foreach") else "default"
    return f"{type(opt).__name__}({impl})"


def _freezing(on: bool) -> contextlib.AbstractContextManager[Any]:
    """Inductor's ``freezing`` for inference: weights become constants, so on CPU linear layers
    get pre-packed MKL/oneDNN weights with bias and GELU fused into the GEMM."""
    if not on:
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


def _make_step(
    model: nn.Module,
    mode: str,
    x: torch.Tensor,
    y: torch.Tensor,
    amp: Callable[[], contextlib.AbstractContextManager[Any]],
    opt: torch.optim.Optimizer | None = None,
) -> Callable[[], None]:
    """One inference forward, or one full training step (forward, backward, ``opt``), under the
    mixed-precision context ``amp`` makes (a no-op one for float32)."""
    if mode == "infer":
        model.eval()

        def infer() -> None:
            with torch.inference_mode(), amp():
                model(x)

        return infer
    if opt is None:
        raise ValueError("a training step needs an optimizer")
    model.train()

    def train() -> None:
        with amp():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return train
