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

Hybrid models' ResNet stems and axial attention are counted as plain blocks (their own activations are not
modelled). The numbers are estimates for planning: allocator fragmentation, the CUDA context, data-loader memory
and communication buffers are not counted (leave ~10-20 % of the device free).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = [
    "PAPER_RUNS",
    "TPUV3_CORE_TFLOPS",
    "MemoryPlan",
    "PaperRun",
    "Plan",
    "activation_bytes",
    "plan",
    "train_flops_per_image",
]

BYTES_STATE = {"weights": 4, "gradients": 4, "optimizer": 8}  # fp32 params, fp32 grads, AdamW m and v
TPUV3_CORE_TFLOPS = 61.5  # one TPUv3 core's bf16 peak (a chip = 2 cores = 123 TFLOP/s)


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
class MemoryPlan:
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
class Plan:
    """Everything ``vitlab plan`` prints: memory per strategy, step time, the paper's runs at this MFU."""

    model: str
    img_size: int
    params: int
    macs: int
    batch_size: int
    devices: int
    per_device_batch: int
    device_memory: int
    memory: tuple[MemoryPlan, ...]
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


def activation_bytes(
    cfg: object, *, img_size: int, batch: int, bytes_per_value: int = 4, checkpointing: bool = False
) -> int:
    """Bytes autograd saves for the backward pass of ``batch`` images of a plain ViT (see the module notes).

    Besides the blocks: the input image (saved by the patch projection), the embedded tokens and
    the final LayerNorm's input and output. With ``checkpointing`` the blocks keep only their inputs,
    plus one block's activations while it is recomputed in the backward pass."""
    d, mlp, heads, depth = cfg.embed_dim, cfg.mlp_dim, cfg.num_heads, cfg.depth  # type: ignore[attr-defined]
    p = cfg.patch_size  # type: ignore[attr-defined]
    tokens = math.ceil(img_size / p) ** 2 + cfg.num_prefix_tokens  # type: ignore[attr-defined]
    block = tokens * (8 * d + 2 * mlp + heads)
    stem = 3 * img_size * img_size + 3 * tokens * d
    blocks = depth * tokens * d + block if checkpointing else depth * block
    return int(batch * (stem + blocks) * bytes_per_value)


def _block_params(model: object) -> tuple[int, int]:
    """``(largest block's parameters, parameters outside the blocks)`` of a model."""
    blocks = getattr(model, "blocks", [])
    per = [sum(p.numel() for p in b.parameters()) for b in blocks] or [0]
    total = sum(p.numel() for p in model.parameters())  # type: ignore[attr-defined]
    return max(per), total - sum(per)


def plan(
    *,
    model: str,
    img_size: int,
    batch_size: int,
    devices: int,
    device_memory: int,
    mfu: float = 0.4,
    peak_tflops: float = 312.0,
    precision: str = "fp32",
) -> Plan:
    """The plan for training registered model ``model`` at ``img_size`` with a global ``batch_size``
    split over ``devices`` devices of ``device_memory`` bytes each, at ``mfu`` of ``peak_tflops``
    (TFLOP/s per device). ``precision``: ``fp32`` or ``bf16`` (autocast: activations in 2 bytes)."""
    import torch

    from ..errors import ConfigError
    from ..models import count_macs, create_model

    if img_size < 1 or batch_size < 1 or devices < 1 or device_memory < 1:
        raise ConfigError("--img-size, --batch-size, --devices and --device-memory must be positive")
    if not 0 < mfu <= 1:
        raise ConfigError(f"--mfu {mfu} is not in (0, 1]")
    if peak_tflops <= 0:
        raise ConfigError(f"--peak-tflops {peak_tflops} must be positive")
    if precision not in ("fp32", "bf16"):
        raise ConfigError(f"--precision {precision!r}: choose fp32 or bf16")
    with torch.device("meta"):
        m = create_model(model, img_size=img_size)
    cfg = m.config
    params = sum(p.numel() for p in m.parameters())
    macs = count_macs(cfg, img_size)
    local = math.ceil(batch_size / devices)
    bpv = 2 if precision == "bf16" else 4
    block, root = _block_params(m)
    acts = activation_bytes(cfg, img_size=img_size, batch=local, bytes_per_value=bpv)
    acts_ckpt = activation_bytes(cfg, img_size=img_size, batch=local, bytes_per_value=bpv, checkpointing=True)

    def fsdp(name: str, a: int) -> MemoryPlan:
        gathered = 2 * block + root  # unsharded: the block computing, the one prefetched, the root's
        return MemoryPlan(
            name,
            weights=math.ceil(params * 4 / devices) + gathered * 4,
            gradients=math.ceil(params * 4 / devices) + (block + root) * 4,
            optimizer=math.ceil(params * 8 / devices),
            activations=a,
        )

    memory = (
        MemoryPlan("DDP", weights=params * 4, gradients=params * 4, optimizer=params * 8, activations=acts),
        fsdp("FSDP", acts),
        fsdp("FSDP + ckpt", acts_ckpt),
    )
    rate = devices * peak_tflops * 1e12 * mfu  # useful FLOP/s of the whole job
    step = batch_size * train_flops_per_image(macs) / rate
    step_ckpt = batch_size * train_flops_per_image(macs, checkpointing=True) / rate
    return Plan(
        model=model,
        img_size=img_size,
        params=params,
        macs=macs,
        batch_size=batch_size,
        devices=devices,
        per_device_batch=local,
        device_memory=device_memory,
        memory=memory,
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
    import torch

    from ..models import count_macs, create_model

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
