"""Capacity planning: per-device memory and step time of a ViT training run, from its configuration alone.

What ``vitlab plan`` prints. Memory is counted the way the training engines lay it out:

* **model states** (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1): fp32 weights (4 bytes a parameter), fp32
  gradients (4) and AdamW's two fp32 moments (8): 16 bytes a parameter. Mixed precision (``bf16``
  autocast) keeps all of them in fp32, so the count does not change with the precision.
  Under DDP every device holds all of them; under FSDP (ZeRO-3, ``fully_shard`` per block) each
  device holds ``1/K`` of them plus the unsharded parameters and gradients of the blocks being
  computed (the current block and the prefetched next one, and the root's embeddings and head).
* **activations**: the tensors autograd saves for the backward pass, counted per encoder block (Eq. 2-3)
  for a block without dropout and with fused attention (``F.scaled_dot_product_attention``, which
  saves its output and a log-sum-exp per head and query, never the ``T x T`` weights): the LN inputs,
  the qkv output, the attention output and its re-laid-out copy, the MLP input, hidden pre- and
  post-GELU: ``T (8 D + 2 D_mlp + heads)`` numbers a sample. With activation checkpointing per block
  only each block's input is kept, and one block's activations exist again while it is recomputed.
* **step time**: forward multiply-accumulates (:func:`vitlab.models.count_macs`) x 2 FLOPs x 3 for the
  forward and backward passes (x 4 with checkpointing: one more forward), divided by the devices'
  peak throughput times an assumed model-FLOPs utilisation (MFU).

A hybrid's ResNet stem and CCT's convolutional tokenizer are counted by their feature maps
(:func:`_hybrid_values`, :func:`_conv_stem_values`), an axial block as two half-blocks. The numbers are estimates
for planning: allocator fragmentation, the CUDA context, data-loader memory and communication buffers are not
counted here (leave ~10-20 % of the device free); ``vitlab train`` adds what a run holds besides
(:mod:`vitlab.train.sizing.memory`) to the same arithmetic before it allocates anything.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from ..._units import format_size
from ...errors import ConfigError
from ..conf.recipes import LIMITS
from ..conf.rules import micro_batch

if TYPE_CHECKING:
    from ...models import ViTConfig

__all__ = [
    "LIMITS",
    "MAX_DEVICE_MEMORY",
    "MAX_PEAK_TFLOPS",
    "PAPER_RUNS",
    "PLAN_MARGIN",
    "TPUV3_CORE_TFLOPS",
    "BatchSplit",
    "Capacity",
    "MemoryNeed",
    "PaperRun",
    "activation_bytes",
    "block_params",
    "check_capacity_numbers",
    "estimate",
    "grid_tokens",
    "inference_bytes",
    "state_bytes",
    "train_flops_per_image",
]

BYTES_STATE = {"weights": 4, "gradients": 4, "optimizer": 8}  # fp32 params, fp32 grads, AdamW m and v
TPUV3_CORE_TFLOPS = 61.5  # one TPUv3 core's bf16 peak (a chip = 2 cores = 123 TFLOP/s)

PLAN_MARGIN = 0.9
"""``vitlab plan``'s "fits": a step's total within this share of the device (the rest: allocator, CUDA context and
communication buffers, which the estimate leaves out)."""

MAX_DEVICE_MEMORY = 1 << 50  # 1 PiB: no accelerator comes near it
MAX_PEAK_TFLOPS = 1e6  # 1 EFLOP/s per device: three orders of magnitude past an H100's dense bf16


def check_capacity_numbers(
    *,
    img_size: int,
    batch_size: int,
    devices: int,
    device_memory: int,
    mfu: float,
    peak_tflops: float,
    accum_steps: int = 1,
) -> None:
    """One :class:`~vitlab.errors.ConfigError` naming the flag for a number no plan can take: a size under 1 or over
    :data:`LIMITS`, an MFU outside (0, 1], a peak throughput that is not a positive finite number (nan, inf)."""
    for flag, v in (
        ("--img-size", img_size),
        ("--batch-size", batch_size),
        ("--devices", devices),
        ("--accum-steps", accum_steps),
    ):
        if not 1 <= v <= LIMITS[flag]:
            raise ConfigError(f"{flag} {v}: must be from 1 to {LIMITS[flag]:,}")
    if not 1 <= device_memory <= MAX_DEVICE_MEMORY:
        raise ConfigError(f"--device-memory {format_size(device_memory)}: must be from 1 byte to 1 PiB")
    if not (math.isfinite(mfu) and 0 < mfu <= 1):
        raise ConfigError(f"--mfu {mfu}: must be in (0, 1], e.g. 0.4")
    if not (math.isfinite(peak_tflops) and 0 < peak_tflops <= MAX_PEAK_TFLOPS):
        raise ConfigError(
            f"--peak-tflops {peak_tflops}: must be a positive finite number of TFLOP/s, at most {MAX_PEAK_TFLOPS:g} "
            "(e.g. 312 for an A100)"
        )


@dataclass(frozen=True)
class PaperRun:
    """A pre-training run of the paper's Table 2, with its TPUv3-core-days."""

    model: str
    dataset: str
    images: int
    epochs: int
    core_days: float
    img_size: int = 224


# Table 2 (Sec. 4.2): "TPUv3-core-days" to pre-train. JFT-300M has 303M images, ImageNet-21k 14M (Sec. 4.1).
# Epochs: ViT-H/14 on JFT 14 and ViT-L/16 on ImageNet-21k 90 (Sec. 4.1 / Appendix B.1); ViT-L/16 on JFT
# is taken as 14 epochs (the paper also trains it for 7; see docs/scale.md).
PAPER_RUNS = (
    PaperRun("vit_h14", "JFT-300M", 303_000_000, 14, 2500.0),
    PaperRun("vit_l16", "JFT-300M", 303_000_000, 14, 680.0),
    PaperRun("vit_l16", "ImageNet-21k", 14_000_000, 90, 230.0),
)


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes per device for one strategy."""

    strategy: str
    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations


@dataclass(frozen=True)
class BatchSplit:
    """A global batch on its processes: ``micro`` images a forward pass on each of ``world_size`` processes,
    ``accum_steps`` passes a step. The one place a micro-batch is computed: the run's memory fit
    (:func:`~vitlab.train.sizing.memory.memory_split`) and ``vitlab plan``'s device (:func:`estimate`) both split
    here, so that plan never plans a batch train would refuse or split otherwise."""

    batch_size: int
    world_size: int
    micro: int
    accum_steps: int

    @classmethod
    def asked(cls, batch_size: int, *, world_size: int, accum_steps: int) -> BatchSplit:
        """The split the options ask for, by ``vitlab train``'s rule (:func:`~vitlab.train.conf.rules.micro_batch`:
        the batch splits evenly over processes and accumulation steps, or a one-line refusal naming them)."""
        micro = micro_batch(batch_size, world_size=world_size, accum_steps=accum_steps)
        return cls(batch_size=batch_size, world_size=world_size, micro=micro, accum_steps=accum_steps)

    def smaller(self, fits: Callable[[int], bool]) -> BatchSplit | None:
        """The largest micro-batch, not above this one, that divides the per-process batch and ``fits``, with as
        many accumulation steps as keep the global batch (and so the recipe) the same; None when one image does
        not fit. Memory falls with the micro-batch, so the first that fits is the fastest split."""
        per = self.batch_size // self.world_size
        micro = next((m for m in range(self.micro, 0, -1) if per % m == 0 and fits(m)), None)
        return None if micro is None else dataclasses.replace(self, micro=micro, accum_steps=per // micro)


@dataclass(frozen=True)
class Capacity:
    """Everything ``vitlab plan`` prints: memory per strategy, step time, the paper's runs at this MFU."""

    model: str
    img_size: int
    params: int
    macs: int
    batch_size: int
    devices: int
    per_device_batch: int
    """Images per forward pass on one device: ``batch_size / (devices x accum_steps)``."""
    accum_steps: int
    device_memory: int
    memory: tuple[MemoryNeed, ...]
    fitted: BatchSplit | None
    """The split ``vitlab train``'s memory fit makes of this batch with DDP on this device: the asked one when its
    step fits in :data:`PLAN_MARGIN` of the device, else more accumulation steps of a smaller micro-batch; None
    when one image a device does not fit (shard the model: FSDP)."""
    step_seconds: float
    step_seconds_checkpointing: float
    images_per_second: float
    mfu: float
    peak_tflops: float
    paper: tuple[dict[str, object], ...]

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["memory"] = [{**asdict(m), "total": m.total} for m in self.memory]
        return d


def train_flops_per_image(macs: int, *, checkpointing: bool = False) -> float:
    """FLOPs of one training image: forward MACs x 2 FLOPs a MAC x 3 (forward + backward, the backward
    costing twice the forward), x 4 instead of 3 when activation checkpointing recomputes the forward."""
    return 2.0 * macs * (4 if checkpointing else 3)


def _pair(img_size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    return (img_size, img_size) if isinstance(img_size, int) else (int(img_size[0]), int(img_size[1]))


def grid_tokens(cfg: object, img_size: int | tuple[int, int]) -> int:
    """Patch tokens of ``cfg``'s model at ``img_size`` (the grid rounded up, as ``dynamic_img_pad`` pads)."""
    h, w = _pair(img_size)
    cell = cfg.patch_size * cfg.stem_stride  # type: ignore[attr-defined]
    return math.ceil(h / cell) * math.ceil(w / cell)


def _hybrid_values(cfg: object, h: int, w: int) -> int:
    """Numbers a hybrid's ResNet stem saves for backward per image (Sec. 3.1's BiT ResNet: 7x7/2 conv, GroupNorm
    and ReLU at half the size, then per bottleneck unit its input, three convolutions' outputs with their norms
    and activations, and a projection shortcut in each stage's first unit)."""
    layers = cfg.hybrid_layers  # type: ignore[attr-defined]
    if layers is None:
        return 0
    values = 3 * 64 * math.ceil(h / 2) * math.ceil(w / 2) + 64 * math.ceil(h / 4) * math.ceil(w / 4)
    for i, units in enumerate(layers):
        out = 256 * 2**i
        cells = math.ceil(h / (4 * 2**i)) * math.ceil(w / (4 * 2**i))
        values += cells * (units * (6 * out // 4 + 4 * out) + 2 * out)
    return values


def _conv_stem_values(cfg: object, h: int, w: int) -> int:
    """Numbers CCT's convolutional tokenizer (:class:`~vitlab.models.hybrid.ConvTokenizer`: per layer a 3x3
    convolution at the input's size, ReLU, 3x3/2 max-pool) saves for backward per image, besides the input image and
    the tokens: per layer the ReLU's output (the pool's input), the pool's int64 indices (two numbers each) and,
    but for the last layer, the pooled map the next convolution takes."""
    if getattr(cfg, "stem", "patch") != "conv":
        return 0
    layers = cfg.stem_layers  # type: ignore[attr-defined]
    widths = [cfg.stem_width] * (layers - 1) + [cfg.embed_dim]  # type: ignore[attr-defined]
    values = 0
    for i, c in enumerate(widths):
        h2, w2 = math.ceil(h / 2), math.ceil(w / 2)
        values += c * h * w + (2 + (i < layers - 1)) * c * h2 * w2
        h, w = h2, w2
    return values


ATTENTION_MATH_BYTES = 13
"""Bytes per attention weight (per head, query and key) that the unfused ("math") attention saves for backward:
the fp32 softmax output, the fp32 weights after dropout and the dropout mask (measured: 12.75 on CPU, also under
bf16 autocast, which computes this path in fp32)."""


def _parts(
    cfg: object, *, img_size: int | tuple[int, int], bytes_per_value: int, keep: float, math_attention: bool
) -> tuple[int, int, int]:
    """``(outside the blocks, one block, one block's input)``: bytes one image saves for backward."""
    d, mlp, heads = cfg.embed_dim, cfg.mlp_dim, cfg.num_heads  # type: ignore[attr-defined]
    h, w = _pair(img_size)
    patches = grid_tokens(cfg, (h, w))
    prefix = cfg.num_prefix_tokens  # type: ignore[attr-defined]
    tokens = math.ceil(patches * keep) + prefix  # what the blocks see
    halves = 2 if getattr(cfg, "attention", "global") == "axial" else 1
    block = halves * tokens * (8 * d + 2 * mlp + heads) * bytes_per_value
    if math_attention and halves == 1:
        block += heads * tokens * tokens * ATTENTION_MATH_BYTES
    stem = cfg.in_chans * h * w + 3 * (patches + prefix) * d  # type: ignore[attr-defined]
    stem += _hybrid_values(cfg, h, w) + _conv_stem_values(cfg, h, w)
    return stem * bytes_per_value, block, tokens * d * bytes_per_value


def activation_bytes(
    cfg: object,
    *,
    img_size: int | tuple[int, int],
    batch: int,
    bytes_per_value: int = 4,
    checkpointing: bool = False,
    keep: float = 1.0,
    math_attention: bool = False,
) -> int:
    """Bytes autograd saves for the backward pass of ``batch`` images of a ViT (see the module notes).

    Besides the blocks: the input image (saved by the patch projection), the embedded tokens and the final LayerNorm's
    input and output, and a hybrid's ResNet stem or a conv stem's feature maps. With ``checkpointing`` the blocks keep
    only their inputs, plus one block's activations while it is recomputed in the backward pass. ``keep``: the share of
    patch tokens the blocks see (token dropping); ``math_attention``: the attention runs unfused (with attention dropout
    on a CPU) and saves its ``T x T`` weights per head (:data:`ATTENTION_MATH_BYTES`). An axial block is two half-blocks
    (Appendix D.6), each with its own attention and MLP."""
    stem, block, block_input = _parts(
        cfg, img_size=img_size, bytes_per_value=bytes_per_value, keep=keep, math_attention=math_attention
    )
    depth = cfg.depth  # type: ignore[attr-defined]
    blocks = depth * block_input + block if checkpointing else depth * block
    return int(batch * (stem + blocks))


def inference_bytes(cfg: object, *, img_size: int | tuple[int, int], batch: int, bytes_per_value: int = 4) -> int:
    """Peak bytes of a forward pass of ``batch`` images without autograd (evaluation, a distillation teacher):
    nothing is saved, so only one block's tensors are alive at a time besides the input and the tokens."""
    stem, block, _ = _parts(cfg, img_size=img_size, bytes_per_value=bytes_per_value, keep=1.0, math_attention=False)
    return int(batch * (stem + block))


OPTIMIZER_BYTES = {"adamw": 8, "adam": 8, "sgd": 4, "muon": 8}
"""Optimizer state per parameter: Adam's two fp32 moments; SGD's fp32 momentum buffer; Muon + AdamW at most Adam's
(Muon keeps one momentum buffer for the encoder's matrices, AdamW two moments for the rest)."""


def state_bytes(
    params: int,
    *,
    strategy: str = "DDP",
    optimizer: str = "adamw",
    devices: int = 1,
    block: int = 0,
    root: int = 0,
    activations: int = 0,
) -> MemoryNeed:
    """Model states per device (see the module notes): every parameter's fp32 weight, gradient and optimizer
    state under DDP (``strategy="DDP"``); under FSDP ``1/devices`` of them plus the unsharded parameters of the
    block computing, the one prefetched and the root's (``block``, ``root``: their parameter counts), and the
    unsharded gradients of one block and the root."""
    per = OPTIMIZER_BYTES[optimizer]
    if strategy == "DDP":
        return MemoryNeed(strategy, params * 4, params * 4, params * per, activations)
    gathered = 2 * block + root
    return MemoryNeed(
        strategy,
        weights=math.ceil(params * 4 / devices) + gathered * 4,
        gradients=math.ceil(params * 4 / devices) + (block + root) * 4,
        optimizer=math.ceil(params * per / devices),
        activations=activations,
    )


def block_params(model: object) -> tuple[int, int]:
    """``(largest block's parameters, parameters outside the blocks)`` of a model."""
    blocks = getattr(model, "blocks", [])
    per = [sum(p.numel() for p in b.parameters()) for b in blocks] or [0]
    total = sum(p.numel() for p in model.parameters())  # type: ignore[attr-defined]
    return max(per), total - sum(per)


def estimate(
    *,
    model: str,
    img_size: int,
    batch_size: int,
    devices: int,
    device_memory: int,
    mfu: float = 0.4,
    peak_tflops: float = 312.0,
    precision: str = "fp32",
    accum_steps: int = 1,
    config: ViTConfig | None = None,
) -> Capacity:
    """What training registered model ``model`` costs (or the model of ``config``, named ``model``: a run folder's,
    a checkpoint's) at ``img_size`` with a global ``batch_size`` split over ``devices`` devices of ``device_memory``
    bytes each and ``accum_steps`` accumulation steps (by ``vitlab train``'s rule, :class:`BatchSplit`: the batch
    must split evenly, and where the step does not fit the device, train's memory fit splits it further), at ``mfu``
    of ``peak_tflops`` (TFLOP/s per device). ``precision``: ``fp32`` or ``bf16`` (autocast: activations in 2
    bytes)."""
    import torch  # lazy: `vitlab plan --help` and the training options' checks import no torch

    from ...models import VisionTransformer, count_macs, create_model  # lazy: as torch, for the meta model

    check_capacity_numbers(
        img_size=img_size,
        batch_size=batch_size,
        devices=devices,
        device_memory=device_memory,
        mfu=mfu,
        peak_tflops=peak_tflops,
        accum_steps=accum_steps,
    )
    if precision not in ("fp32", "bf16"):
        raise ConfigError(f"--precision {precision!r}: choose fp32 or bf16")
    split = BatchSplit.asked(batch_size, world_size=devices, accum_steps=accum_steps)  # train's rule and message
    local = split.micro
    with torch.device("meta"):
        if config is None:
            m = create_model(model, img_size=img_size)
        else:
            m = VisionTransformer(config.replace(img_size=(img_size, img_size)))
    cfg = m.config
    params = sum(p.numel() for p in m.parameters())
    macs = count_macs(cfg, img_size)
    bpv = 2 if precision == "bf16" else 4
    block, root = block_params(m)
    acts = activation_bytes(cfg, img_size=img_size, batch=local, bytes_per_value=bpv)
    acts_ckpt = activation_bytes(cfg, img_size=img_size, batch=local, bytes_per_value=bpv, checkpointing=True)
    sharded = {"devices": devices, "block": block, "root": root}
    memory = (
        state_bytes(params, activations=acts),
        state_bytes(params, strategy="FSDP", activations=acts, **sharded),
        state_bytes(params, strategy="FSDP + ckpt", activations=acts_ckpt, **sharded),
    )

    def fits(micro: int) -> bool:
        acts = activation_bytes(cfg, img_size=img_size, batch=micro, bytes_per_value=bpv)
        return state_bytes(params, activations=acts).total <= PLAN_MARGIN * device_memory

    rate = devices * peak_tflops * 1e12 * mfu  # useful FLOP/s of the whole job
    step = batch_size * train_flops_per_image(macs) / rate
    step_ckpt = batch_size * train_flops_per_image(macs, checkpointing=True) / rate
    return Capacity(
        model=model,
        img_size=img_size,
        params=params,
        macs=macs,
        batch_size=batch_size,
        devices=devices,
        per_device_batch=local,
        accum_steps=accum_steps,
        device_memory=device_memory,
        memory=memory,
        fitted=split.smaller(fits),
        step_seconds=step,
        step_seconds_checkpointing=step_ckpt,
        images_per_second=batch_size / step,
        mfu=mfu,
        peak_tflops=peak_tflops,
        paper=tuple(paper_run(r, mfu=mfu, peak_tflops=peak_tflops, devices=devices) for r in PAPER_RUNS),
    )


def paper_run(run: PaperRun, *, mfu: float, peak_tflops: float, devices: int) -> dict[str, object]:
    """One of the paper's runs: its total FLOPs, the TPUv3-core-days it would take at 100 % and at
    ``mfu``, the MFU that the paper's core-days imply, and the days on ``devices`` devices of
    ``peak_tflops`` at ``mfu``."""
    import torch  # lazy: as in estimate()

    from ...models import count_macs, create_model  # lazy: as torch, for the meta-device model

    with torch.device("meta"):
        m = create_model(run.model, img_size=run.img_size)
    flops = run.images * run.epochs * train_flops_per_image(count_macs(m.config, run.img_size))
    core_day = TPUV3_CORE_TFLOPS * 1e12 * 86400
    device_days = flops / (peak_tflops * 1e12 * mfu * 86400)
    return {
        "model": run.model,
        "dataset": run.dataset,
        "epochs": run.epochs,
        "images": run.images,
        "flops": flops,
        "paper_core_days": run.core_days,
        "core_days_at_100pct": flops / core_day,
        "core_days_at_mfu": flops / core_day / mfu,
        "implied_mfu": flops / core_day / run.core_days,
        "device_days": device_days,
        "wall_days": device_days / devices,
    }
