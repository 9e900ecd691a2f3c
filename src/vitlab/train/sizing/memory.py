"""Memory before the run: estimate a training step's peak from the configuration, compare it with the memory this
process may use, and split the batch into accumulation steps, or refuse in one line, before anything big is
allocated (the model, the optimizer, the loaders).

The estimate is :mod:`vitlab.train.sizing.capacity`'s arithmetic (what ``vitlab plan`` prints), applied to the run:

* **states**: fp32 weights, gradients and the optimizer's state (:func:`~vitlab.train.sizing.capacity.state_bytes`,
  sharded with ``--fsdp``; a fine-tune that trains the head, LoRA, SSF or the biases only has gradients and state
  for those alone, :func:`trained_parameters`), an EMA copy of the weights, the ``--time-budget`` probe's copy of
  the model, and autocast's low-precision copy of the weights on a GPU;
* **activations** of one micro-batch (:func:`~vitlab.train.sizing.capacity.activation_bytes`: token dropping, prefix
  tokens, checkpointing, the ``T x T`` attention weights where the attention runs unfused; ``--pack``'s
  sequences at their most, as images of the model's size holding their tokens), plus one block's
  temporaries in the backward pass. On a CPU the fused training blocks (:mod:`vitlab.accel.fused_block`) keep
  every block's activations in buffers, with ``--grad-checkpointing`` too (its recomputed forward writes them
  again), so checkpointing saves nothing there; the plain path's fresh tensors fragment glibc's heap
  (:data:`HEAP_SLACK`);
* **the objective**: the class head's logits and their gradient; masked patch prediction's colour head on every
  corrupted patch (:func:`mpp_bytes`); a distillation teacher's forward pass;
* **evaluation**: a forward pass of the whole evaluation batch, while the fused CPU blocks keep their training
  buffers (:mod:`vitlab.accel.buffers`). A classifier's CPU inference runs in chunks and needs less: the
  over-count only ever lowers the evaluation batch, never the training batch, which is fitted with an
  evaluation batch of one;
* **data**: the DataLoader workers' prefetched batches and their processes, and the decode budget
  (``--memory-budget``).

What is available is the smaller of ``MemAvailable`` (``/proc/meminfo``) and what the cgroup's limit leaves
(v2 ``memory.max``, v1 ``memory.limit_in_bytes``, less the usage that is not reclaimable file cache), shared by
the processes of a node on a CPU; a GPU's free memory on CUDA. A plan must fit in :data:`MARGIN` of it. What is
already allocated when it is measured (the decoded data, a teacher's weights) is counted there, not here.
docs/reliability.md has the calibration against measured peaks.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from ..._units import format_size
from ...adapters import DEFAULT_TARGETS, apply_tuning
from ...data.pipeline.navit import token_budget
from ...distributed import Dist
from ...errors import ConfigError
from ...models.config import BLOCK_OBJECT_BYTES
from ...models.mpp import MaskedPatchPrediction
from ...models.vit import VisionTransformer
from ..conf.arch import SIZE_PATHS, smallest_config
from ..conf.options import OptionError, ref
from ..conf.phases import ends_dropping
from ..conf.recipes import Recipe
from ..conf.train_config import TrainConfig, objective_name
from . import capacity
from .capacity import BatchSplit, grid_tokens, inference_bytes
from .machine import available_memory, cgroup_available

__all__ = [
    "IMAGES_PER_SEQUENCE",
    "MARGIN",
    "MemorySplit",
    "PackGeometry",
    "StepMemory",
    "available_memory",
    "cgroup_available",
    "check_model_size",
    "estimate",
    "memory_split",
    "objective_bytes",
    "pack_geometry",
    "parameter_counts",
    "trained_parameters",
]

MARGIN = 0.8
"""The share of the available memory a run may plan to use: the rest covers the allocator's slack and what the
estimate does not see."""
WORKER_BYTES = 64 << 20
"""Memory of one DataLoader worker process besides its batches: its own pages after the fork, 16 MiB measured
(docs/reliability.md), taken four times over for the pages a longer run touches."""
PREFETCH = 2  # torch's DataLoader prefetch_factor: batches each worker prepares ahead
HEAP_SLACK = 2.0
"""On a CPU, autograd's activations of the plain (unfused) path are fresh tensors each step; glibc serves those
under its mmap threshold (which grows to 32 MiB) from a heap it does not hand back, and the heap fragments: the
peak measured 1.6 times that of the same run with the threshold fixed at 1 MiB (docs/reliability.md)."""
AMP_ACTIVATIONS = 1.25
"""Under autocast on a GPU the residual stream and the LayerNorms' inputs stay fp32: activations are about a
quarter over a count at 2 bytes a number."""


@dataclass(frozen=True)
class StepMemory:
    """Peak bytes of a training run, by what holds them (see the module notes)."""

    states: int
    activations: int
    objective: int
    evaluation: int
    data: int
    held_in_evaluation: int
    """Of ``activations``: what stays allocated while evaluating (the fused CPU blocks' buffers)."""

    @property
    def total(self) -> int:
        train = self.activations + self.objective
        return self.states + max(train, self.held_in_evaluation + self.evaluation) + self.data


@dataclass(frozen=True)
class MemorySplit:
    """What :func:`memory_split` decided: the recipe (its batch perhaps split into more accumulation steps), the
    images of a forward pass on each process (``micro``), the evaluation batch, the estimate, the bytes available
    (None: not measurable here) and the line that says why the batch was split (None: it was not)."""

    recipe: Recipe
    micro: int
    eval_batch: int
    estimate: StepMemory
    available: int | None
    line: str | None = None


IMAGES_PER_SEQUENCE = 4
"""``--pack-len``'s default: room for this many images at the highest resolution in one sequence."""


@dataclass(frozen=True)
class PackGeometry:
    """``resolution`` (the ``(low, high)`` side drawn per image), ``max_tokens`` (an image's patches at the high
    side), ``prefix`` (the model's class, distillation and register tokens) and ``pack_len`` (tokens a sequence)."""

    resolution: tuple[float, float]
    max_tokens: int
    prefix: int
    pack_len: int

    def sequences(self, images: int) -> int:
        """The most sequences ``images`` images can take (each at its most tokens)."""
        return math.ceil(images / max(1, self.pack_len // (self.max_tokens + self.prefix)))


def pack_geometry(cfg: TrainConfig, model_config: Any) -> PackGeometry:
    """The run's packing: ``--pack-res`` (default: the side of a square of the model's image area, both ends),
    ``--pack-len`` (default: :data:`IMAGES_PER_SEQUENCE` images at the high side); a ``--pack-len`` that cannot
    hold one image is refused."""
    h, w = model_config.img_size
    side = math.sqrt(h * w)
    lo, hi = cfg.pack_res or (side, side)
    p, prefix = model_config.patch_size * model_config.stem_stride, model_config.num_prefix_tokens
    if hi < p:
        raise OptionError(ref("pack_res"), f" {lo:g},{hi:g}: the high side must be at least the patch size {p}")
    most = token_budget(hi, p)
    pack_len = cfg.pack_len or IMAGES_PER_SEQUENCE * (most + prefix)
    if pack_len < most + prefix:
        raise OptionError(ref("pack_len"), f" {pack_len}: an image may take {most + prefix} tokens ({most} patches "
                          f"at {hi:g} px, {prefix} prefix); pass at least that")  # fmt: skip
    return PackGeometry(resolution=(float(lo), float(hi)), max_tokens=most, prefix=prefix, pack_len=pack_len)


def _bytes_per_value(cfg: TrainConfig, device_type: str) -> tuple[int, float]:
    """``(bytes a value, factor)`` of the activations: fp32 on a CPU (autocast computes much of a block in fp32
    there), 2 bytes with ``AMP_ACTIVATIONS`` under autocast on a GPU."""
    amp = device_type == "cuda" and cfg.precision in ("auto", "bf16", "fp16")
    return (2, AMP_ACTIVATIONS) if amp else (4, 1.0)


def estimate(
    cfg: TrainConfig,
    model_config: Any,
    *,
    recipe: Recipe | None = None,
    micro: int,
    eval_batch: int,
    device_type: str,
    world_size: int = 1,
    workers: int = 1,
    teacher: Any = None,
    num_classes: int = 0,
    counts: tuple[int, int, int] | None = None,
) -> StepMemory:
    """The peak of training ``model_config``'s ViT as ``cfg`` says, with ``recipe`` (the run's: its
    :class:`~vitlab.train.sizing.Sizing`'s; None: ``cfg``'s), ``micro`` images a forward pass and ``eval_batch``
    images an evaluation pass (see the module notes). ``teacher``: the distillation teacher's model config;
    ``num_classes``: the head's classes (0 for MPP); ``counts``: :func:`parameter_counts`."""
    r, mc = recipe or cfg.recipe, model_config
    learns = objective_name(cfg)
    params, block, root = counts or parameter_counts(mc, learns=learns)
    strategy = "FSDP" if cfg.fsdp else "DDP"
    st = capacity.state_bytes(
        params, strategy=strategy, optimizer=r.optimizer, devices=world_size, block=block, root=root
    )
    if strategy == "DDP" and (trained := trained_parameters(mc, r, params=params)) < params:
        st = dataclasses.replace(st, gradients=trained * 4, optimizer=trained * capacity.OPTIMIZER_BYTES[r.optimizer])
    copies = (r.ema is not None) + bool(cfg.time_budget and not cfg.compile)  # EMA, the budget probe's model
    states = st.weights + st.gradients + st.optimizer + copies * st.weights
    states += (1 + copies) * mc.depth * BLOCK_OBJECT_BYTES  # each copy's blocks as Python objects
    bpv, factor = _bytes_per_value(cfg, device_type)
    if bpv == 2:
        states += params * 2  # autocast's cast of the weights
    img = tuple(mc.img_size)
    keep = 1.0 - r.token_drop if r.token_drop and not ends_dropping(r) else 1.0  # some steps see every token
    fused = _fused_cpu_blocks(cfg, mc, device_type)
    if cfg.pack:  # the most sequences a micro-batch can take, as images of the model's size holding their tokens
        keep, per_image = 1.0, capacity.grid_tokens(mc, img) + mc.num_prefix_tokens
        geo = pack_geometry(cfg, mc)
        micro = math.ceil(geo.sequences(micro) * geo.pack_len / per_image)
    kw = {"img_size": img, "bytes_per_value": bpv}
    acts = capacity.activation_bytes(
        mc,
        batch=micro,
        checkpointing=cfg.grad_checkpointing and not fused,  # the fused blocks' buffers hold every block's
        keep=keep,
        math_attention=device_type == "cpu" and mc.attn_drop_rate > 0,
        **kw,
    )
    temporaries = 1 + (cfg.grad_checkpointing and fused)  # the backward's: about one block; and the recomputed one
    acts += temporaries * capacity.inference_bytes(mc, batch=micro, **kw)
    if device_type == "cpu" and not fused:
        factor *= HEAP_SLACK
    acts = int(acts * factor)
    evaluation = int(capacity.inference_bytes(mc, batch=eval_batch, **kw) * factor)
    pixels = mc.in_chans * img[0] * img[1] * 4
    objective, objective_eval = objective_bytes(
        learns, r, mc, micro=micro, eval_batch=eval_batch, bytes_per_value=bpv, num_classes=num_classes,
        teacher=teacher,
    )  # fmt: skip
    evaluation += objective_eval
    prefetch = PREFETCH * workers * micro * pixels
    data = prefetch + workers * WORKER_BYTES + (cfg.memory_budget or 64 << 20)
    held = acts if fused else 0
    return StepMemory(
        states=states,
        activations=acts,
        objective=objective,
        evaluation=evaluation,
        data=data,
        held_in_evaluation=held,
    )


def _fused_cpu_blocks(cfg: TrainConfig, mc: Any, device_type: str) -> bool:
    """Whether the training blocks run as :mod:`vitlab.accel.fused_block`'s one autograd node (its conditions: a
    CPU, float32 without autocast, eager, no dropout inside the block, a qkv bias, a GELU MLP, global attention;
    packed input without stochastic depth or checkpointing: :meth:`vitlab.accel.FastVisionTransformer.encode_packed`).
    Those blocks keep their activations in buffers from one step to the next (:mod:`vitlab.accel.buffers`), also
    while evaluating and also under ``--grad-checkpointing``, whose recomputed forward writes them again."""
    return (
        device_type == "cpu"
        and not (cfg.pack and (mc.drop_path_rate > 0 or cfg.grad_checkpointing))  # (packed: by length, else plain)
        and cfg.precision in ("auto", "fp32")
        and not cfg.compile
        and mc.attn_drop_rate == 0
        and mc.drop_rate == 0
        and mc.qkv_bias
        and mc.act in ("gelu", "gelu_tanh")
        and mc.attention == "global"
    )


def parameter_counts(model_config: Any, *, learns: str = "classify") -> tuple[int, int, int]:
    """``(parameters, the largest block's, those outside the blocks)`` of the module a run that ``learns`` (an
    objective's name, :func:`~vitlab.train.conf.train_config.objective_name`) trains: the ViT's by arithmetic
    (:meth:`~vitlab.models.config.ViTConfig.num_params`), and what masked patch prediction's colour head adds
    around it (``mpp`` and the warm start) counted around a one-block ViT on the meta device. Nothing is
    allocated, and no module the size of the model is built."""
    vit = model_config.num_params()
    block = model_config.block_params()
    added = 0
    if learns in ("mpp", "warmstart"):
        with torch.device("meta"):
            small = VisionTransformer(model_config.replace(depth=1))
            net = MaskedPatchPrediction(small, switched_token_drop=learns == "warmstart")
            added = sum(p.numel() for p in net.parameters()) - sum(p.numel() for p in small.parameters())
    return vit + added, block, vit - model_config.depth * block + added


def trained_parameters(model_config: Any, recipe: Recipe, *, params: int) -> int:
    """The parameters that get a gradient and optimizer state when ``recipe`` fine-tunes ``model_config``'s ViT of
    ``params`` parameters: all of them (``--tune full``); else those its method trains (:attr:`Recipe.tuning`: the
    head, or :func:`vitlab.adapters.apply_tuning`'s LoRA, SSF or biases with the head), counted on a one-block ViT
    on the meta device and scaled to the depth: nothing is allocated, and every family's layers count as built.
    A method that cannot apply counts every parameter (the run refuses it later, in one line)."""
    t = recipe.tuning
    if t == "full":
        return params
    with torch.device("meta"):
        small = VisionTransformer(model_config.replace(depth=1))
        if t == "head":
            for name, p in small.named_parameters():
                p.requires_grad_(name.startswith("head."))
        else:
            try:
                apply_tuning(small, t, rank=recipe.lora_rank, alpha=recipe.lora_alpha,
                             targets=recipe.lora_targets or DEFAULT_TARGETS)  # fmt: skip
            except ConfigError:
                return params
    block = sum(p.numel() for p in small.blocks[0].parameters() if p.requires_grad)
    total = sum(p.numel() for p in small.parameters() if p.requires_grad)
    return total + (model_config.depth - 1) * block


def check_model_size(cfg: TrainConfig, *, dist: Dist, device: torch.device) -> None:
    """Refuse, before the data is read and before any module is built, a model whose weights, gradients and
    optimizer state alone (:func:`~vitlab.train.sizing.capacity.state_bytes`, sharded with ``--fsdp``) and its
    blocks' objects are more than the memory available: the smallest model the options describe
    (:func:`~vitlab.train.conf.arch.smallest_config`), counted by arithmetic. One line names the options that make
    it big (``--depth 100000``, a config file's ``arch.embed_dim``). Only a size the user gave is checked here: a
    recipe's or a registered ``--model``'s is :func:`memory_split`'s (after the data, with the whole step), and an
    ``--init`` model's its checkpoint's (checked when it is read)."""
    given = [p for p in SIZE_PATHS if _size_value(cfg, p) is not None]
    if "arch" in cfg.recipe_given and not (cfg.model or cfg.recipe.model):  # a config file's recipe.arch
        given.append("recipe.arch")
    if cfg.init or not given:  # a recipe's or a registered model's size: memory_split's estimate, after the data
        return
    mc = smallest_config(cfg)
    params = mc.num_params()
    block = mc.block_params()
    st = capacity.state_bytes(params, strategy="FSDP" if cfg.fsdp else "DDP", optimizer=cfg.recipe.optimizer,
                              devices=dist.world_size, block=block, root=params - mc.depth * block)  # fmt: skip
    need = st.weights + st.gradients + st.optimizer + mc.depth * BLOCK_OBJECT_BYTES
    found = _shared_available(device, dist)
    if found is None or need <= found[0]:
        return
    have = f"the {format_size(found[0])} available ({found[1]})"
    what = (
        f": the model ({mc.name}, {params:,} parameters at its smallest) needs ~{format_size(need)} for its weights, "
        f"gradients and optimizer state, more than {have}"
    )
    parts: list[str] = []
    for i, path in enumerate(given):
        value = _size_value(cfg, path)
        parts += [", " if i else "", ref(path), "" if path == "recipe.arch" else f" {value}"]
    raise OptionError(*parts, what, f"; lower {'it' if len(given) == 1 else 'them'}")


def _size_value(cfg: TrainConfig, path: str) -> Any:
    """The value an option of :data:`~vitlab.train.conf.arch.SIZE_PATHS` was given (None: not given)."""
    if path == "img_size":
        return cfg.img_size
    return cfg.arch.get(path.removeprefix("arch."))


def objective_bytes(
    learns: str, recipe: Recipe, model_config: Any, *, micro: int, eval_batch: int, bytes_per_value: int,
    num_classes: int, teacher: Any = None,
) -> tuple[int, int]:  # fmt: skip
    """``(training, evaluation)``: bytes what a run ``learns`` (an objective's name) adds to a step of ``micro``
    images and to an evaluation pass of ``eval_batch``, beyond the ViT's own activations: a classifier's logits,
    their log-softmax and gradient, MixUp/CutMix's mixed batch and soft targets, a distillation teacher's forward
    pass (:func:`_teacher_bytes`); masked patch prediction's colour head (:func:`mpp_bytes`); a warm start's larger
    of the two (one phase at a time)."""
    mc, bpv = model_config, bytes_per_value
    if learns == "mpp":
        return mpp_bytes(mc, batch=micro, bytes_per_value=bpv), mpp_bytes(mc, batch=eval_batch, bytes_per_value=bpv)
    train = micro * num_classes * (bpv + 8)
    h, w = mc.img_size
    if recipe.mixup or recipe.cutmix:
        train += micro * (mc.in_chans * h * w * 4 + 2 * num_classes * 4)
    if teacher is not None:
        train += _teacher_bytes(teacher, micro=micro, bytes_per_value=bpv, num_classes=num_classes)
    if learns == "warmstart":
        train = max(train, mpp_bytes(mc, batch=micro, bytes_per_value=bpv))
    return train, eval_batch * num_classes * 8


def _teacher_bytes(teacher: Any, *, micro: int, bytes_per_value: int, num_classes: int) -> int:
    """Bytes of a frozen teacher's forward pass over ``micro`` images: its activations without autograd, the batch
    resized to its input and its logits."""
    h, w = teacher.img_size
    acts = inference_bytes(teacher, img_size=(h, w), batch=micro, bytes_per_value=bytes_per_value)
    return acts + micro * (teacher.in_chans * h * w * 4 + num_classes * 4)


def mpp_bytes(model_config: Any, *, batch: int, bytes_per_value: int = 4) -> int:
    """Bytes masked patch prediction (:class:`~vitlab.models.mpp.MaskedPatchPrediction`) adds to a step of ``batch``
    images of ``model_config``'s ViT, beyond the ViT's own (:func:`~vitlab.train.sizing.capacity.activation_bytes`):
    the [0, 1] pixel copy the colour targets are read from, the corruption's draws, indices, targets and token
    copies, and the 512-way colour head on every patch (its logits, log-softmax and their gradient, the per-patch
    loss and its weight: the loss weighs the corrupted ones). Evaluation holds the same."""
    c = model_config
    h, w = c.img_size
    n = grid_tokens(c, (h, w))
    pixels = 2 * c.in_chans * h * w * 4  # images * std + mean, then clamped
    corrupt = n * (2 * 4 + 3 * 8 + 3 * c.embed_dim * bytes_per_value + 2)  # two draws, indices, targets, copies
    head = n * (512 * (bytes_per_value + 4 + 4) + 3 * 4 + 8)
    return int(batch * (pixels + corrupt + head))


def _shared_available(device: torch.device, dist: Dist) -> tuple[int, str] | None:
    """:func:`available_memory` for one process: on a CPU divided among the node's processes
    (``LOCAL_WORLD_SIZE``); the smallest over the ranks, so that every rank decides the same."""
    found = available_memory(device)
    n, why = found if found is not None else (-1, "unknown")
    if n >= 0 and device.type == "cpu":
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        if local > 1:
            n, why = n // local, f"{why}, shared by {local} processes"
    if dist.enabled:
        t = torch.tensor([n if n >= 0 else 1 << 62], dtype=torch.int64)
        tdist.all_reduce(t, op=tdist.ReduceOp.MIN)
        n = int(t.item())
        if n >= 1 << 62:
            return None
    return (n, why) if n >= 0 else None


def _size(mc: Any) -> str:
    h, w = mc.img_size
    return f"{h} px" if h == w else f"{h}x{w} px"


def memory_split(
    cfg: TrainConfig,
    recipe: Recipe,
    *,
    model_config: Any,
    dist: Dist,
    device: torch.device,
    num_classes: int,
    teacher: Any = None,
    resumed: bool = False,
) -> MemorySplit:
    """Check the run fits in memory before it allocates, and make it fit by accumulation when it does not.

    The micro-batch is the largest divisor of the per-process batch whose step fits in :data:`MARGIN` of the
    memory available; the recipe's ``accum_steps`` grows so that the global batch, and so the recipe, stays
    the same (the split's line says so). When a micro-batch of one image does not fit, a
    :class:`~vitlab.errors.ConfigError` names the flags that shrink the run. A resumed run keeps its
    micro-batch (its saved position counts micro-batches) and only warns. The evaluation batch is the largest of
    ``max(micro, 256)`` halved until it fits. The one place a run's micro-batch is computed (by
    :class:`~vitlab.train.sizing.capacity.BatchSplit`, whose split ``vitlab plan`` shows for the machine it is
    asked about)."""
    r = recipe
    w = dist.world_size
    asked = BatchSplit.asked(r.batch_size, world_size=w, accum_steps=r.accum_steps)  # before any work
    micro0 = asked.micro
    workers = cfg.workers if cfg.workers >= 0 else 1
    counts = parameter_counts(model_config, learns=objective_name(cfg))

    def need(micro: int, eval_batch: int, run: TrainConfig = cfg) -> StepMemory:
        return estimate(
            run,
            model_config,
            recipe=r,
            micro=micro,
            eval_batch=eval_batch,
            device_type=device.type,
            world_size=w,
            workers=workers,
            teacher=teacher,
            num_classes=num_classes,
            counts=counts,
        )

    found = _shared_available(device, dist)
    if found is None:
        e = max(micro0, 256)
        return MemorySplit(recipe=r, micro=micro0, eval_batch=e, estimate=need(micro0, e), available=None)
    avail, where = found
    usable = int(avail * MARGIN)
    have = f"{format_size(avail)} available ({where})"
    first = need(micro0, 1)
    step = f"a step of {micro0} image{'s' if micro0 > 1 else ''} at {_size(model_config)}"
    line = None
    if resumed and first.total > usable:
        line = (
            f"warning: memory: {step} needs ~{format_size(first.total)}, {have}: "
            "the resumed run keeps its batch and may run out of memory"
        )
    split = asked if resumed else asked.smaller(lambda m: need(m, 1).total <= usable)
    if split is None:
        one = need(1, 1)
        ckpt = not cfg.grad_checkpointing and need(1, 1, dataclasses.replace(cfg, grad_checkpointing=True)).total < (
            0.9 * one.total
        )
        raise ConfigError(_refusal(one, model_config, have, checkpointing_helps=ckpt, cfg=cfg, workers=workers))
    micro = split.micro
    if split != asked:  # micro divides the per-process batch: the split holds the loaders' rule
        accum = split.accum_steps
        line = (
            f"memory: {step} needs ~{format_size(first.total)}, {have} -> {accum} accumulation steps of "
            f"{micro} image{'s' if micro > 1 else ''}{' per process' if w > 1 else ''} (the batch of "
            f"{r.batch_size} and the recipe unchanged)"
        )
        r = dataclasses.replace(r, accum_steps=accum)
    eval_batch = max(micro, 256)
    while eval_batch > 1 and need(micro, eval_batch).total > usable:
        eval_batch = math.ceil(eval_batch / 2)
    return MemorySplit(recipe=r, micro=micro, eval_batch=eval_batch, estimate=need(micro, eval_batch),
                       available=avail, line=line)  # fmt: skip


def _refusal(
    one: StepMemory, mc: Any, have: str, *, checkpointing_helps: bool, cfg: TrainConfig | None = None, workers: int = 0
) -> str:
    """The one line refusing a run whose step of one image (``one``) does not fit, naming the flags that shrink
    it (``--grad-checkpointing`` only where it would: not on a CPU's fused blocks); first the one at fault when the
    data loading (``--workers``, ``--memory-budget``) or ``--pack-len``'s sequences take most of it."""
    flags = ["lower --img-size", "raise --patch-size", "choose a smaller --model"]
    if checkpointing_helps:
        flags.append("add --grad-checkpointing")
    if cfg is not None and cfg.pack and cfg.pack_len is not None and one.activations > one.total / 2:
        flags.insert(0, f"lower --pack-len {cfg.pack_len:,}")
    if one.data > one.total / 2:
        flags.insert(0, f"lower --workers {workers:,}" if workers > 1 else "lower --memory-budget")
    return (
        f"memory: a step of 1 image at {_size(mc)} needs ~{format_size(one.total)} "
        f"(model states {format_size(one.states)}, activations {format_size(one.activations)}, "
        f"data loading {format_size(one.data)}), "
        f"more than {MARGIN:.0%} of the {have}; {', '.join(flags[:-1])} or {flags[-1]}"
    )
