"""``vitlab plan``: per-device memory and step time of a training run, and the paper's pre-training runs."""

from __future__ import annotations

import argparse
import json

from .._units import counted


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "plan",
        help="memory per device (DDP / FSDP / FSDP + checkpointing) and step time of a training run",
        description=(
            "Estimate, from the model's configuration alone, the memory each device needs for weights,\n"
            "gradients, AdamW state and activations under DDP, FSDP and FSDP with activation checkpointing,\n"
            "the step time at an assumed MFU, and the paper's pre-training runs (Table 2) at that MFU.\n"
            "Nothing is allocated: the model is built on the meta device. See docs/scale.md.\n\n"
            "--model takes what the other commands take (the one model rule): a registered name, a run or\n"
            "model folder, a checkpoint file; only its configuration is read.\n\n"
            "examples:\n"
            "  vitlab plan --model vit_l16 --img-size 224 --batch-size 4096 --devices 64 --device-memory 80G\n"
            "  vitlab plan --model runs/photos --batch-size 256 --devices 2 --device-memory 24G"
        ),
        formatter_class=formatter,
    )
    p.add_argument(
        "--model",
        required=True,
        help="a registered architecture name (vitlab models), a run or model folder, a checkpoint file or a public "
        "name: its configuration",
    )
    p.add_argument("--img-size", type=int, default=None, help="input resolution (default: the model's; 224 for a name)")
    p.add_argument("--batch-size", type=int, default=4096, help="global batch (the paper pre-trains with 4096)")
    p.add_argument("--devices", type=int, default=8, help="number of devices (processes) sharing the batch")
    p.add_argument(
        "--accum-steps",
        type=int,
        default=1,
        help="gradient accumulation steps (as vitlab train: the batch must divide by devices x accumulation steps)",
    )
    p.add_argument("--device-memory", default="80G", help="memory of one device, e.g. 80G, 24G")
    p.add_argument("--mfu", type=float, default=0.4, help="assumed model-FLOPs utilisation, in (0, 1]")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=312.0,
        help="peak TFLOP/s of one device (312: A100 bf16 dense; 989: H100 SXM; 123: a TPUv3 chip)",
    )
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="activation precision")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f}"


def run(args: argparse.Namespace) -> int:
    from .._text import shown
    from .._units import size_option
    from ..resolve import model_source, source_config
    from ..train.sizing.capacity import PLAN_MARGIN, estimate

    memory = size_option("--device-memory", args.device_memory)
    source = model_source(args.model)  # the one model rule; nothing but the configuration is read
    config = None if source.kind == "architecture" else source_config(source)
    pl = estimate(
        model=args.model,
        config=config,
        img_size=args.img_size if args.img_size is not None else config.img_size[0] if config is not None else 224,
        batch_size=args.batch_size,
        devices=args.devices,
        device_memory=memory,
        mfu=args.mfu,
        peak_tflops=args.peak_tflops,
        precision=args.precision,
        accum_steps=args.accum_steps,
    )
    if args.json:
        print(json.dumps(pl.to_dict(), indent=2))
        return 0
    print(
        f"{shown(pl.model)} at {pl.img_size} px: {pl.params / 1e6:.1f}M params, "
        f"{2 * pl.macs / 1e9:.1f} GFLOPs forward; "
        f"batch {pl.batch_size} over {counted(pl.devices, 'device')}"
        + (f" x {pl.accum_steps} accumulation steps" if pl.accum_steps > 1 else "")
        + f" = {pl.per_device_batch} per device{' and step' if pl.accum_steps > 1 else ''}, "
        f"{args.precision} activations"
    )
    print(f"\nper-device memory, GiB (device: {_gb(pl.device_memory)} GiB)")
    print(f"{'strategy':<13}{'weights':>9}{'grads':>9}{'AdamW':>9}{'activ.':>9}{'total':>9}  fits")
    for m in pl.memory:
        fits = "yes" if m.total <= PLAN_MARGIN * pl.device_memory else "no"
        print(
            f"{m.strategy:<13}{_gb(m.weights):>9}{_gb(m.gradients):>9}{_gb(m.optimizer):>9}"
            f"{_gb(m.activations):>9}{_gb(m.total):>9}  {fits}"
        )
    split = pl.fitted
    if split is None:
        print("DDP: a step of 1 image a device does not fit; see the FSDP rows (vitlab train --fsdp)")
    elif split.micro != pl.per_device_batch:
        print(
            f"DDP: vitlab train splits it into {split.accum_steps} accumulation steps of "
            f"{counted(split.micro, 'image')} a device (the largest that fits; the batch of {pl.batch_size} unchanged)"
        )
    print(
        f"\nstep: {pl.step_seconds:.3f} s ({pl.step_seconds_checkpointing:.3f} s with checkpointing), "
        f"{pl.images_per_second:,.0f} images/s at MFU {pl.mfu:g} of {pl.peak_tflops:g} TFLOP/s per device"
    )
    on = "this device" if pl.devices == 1 else f"these {pl.devices} devices"
    print(f"\nthe paper's pre-training runs (Table 2; TPUv3 core = 61.5 bf16 TFLOP/s), on {on}:")
    print(
        f"{'model':<9}{'data':<14}{'epochs':>7}{'EFLOP':>8}{'paper core-d':>13}"
        f"{'core-d @MFU':>12}{'implied MFU':>12}{'wall days':>10}"
    )
    for r in pl.paper:
        print(
            f"{r['model']:<9}{r['dataset']:<14}{r['epochs']:>7}{r['flops'] / 1e18:>8.0f}{r['paper_core_days']:>13,.0f}"
            f"{r['core_days_at_mfu']:>12,.0f}{r['implied_mfu']:>12.2f}{r['wall_days']:>10.1f}"
        )
    print(
        f"fits: total <= {PLAN_MARGIN:.0%} of the device; estimates leave out allocator, CUDA context and comms buffers"
    )
    return 0
