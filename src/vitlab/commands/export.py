"""``vitlab export``: a checkpoint -> ONNX or TorchScript with a dynamic batch size."""

from __future__ import annotations

import argparse

from ._common import add_model_arg


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "export",
        help="export a model to ONNX (onnxruntime) or TorchScript, dynamic batch size",
        description=(
            "Load a model (a vitlab folder, any checkpoint `vitlab convert` reads, or a registered\n"
            "name for a randomly initialised one) and write it as ONNX or TorchScript. Input\n"
            "`pixel_values` (batch, C, H, W), normalised; output `logits`. The export is checked\n"
            "against PyTorch on a batch of another size (max |diff| <= --tolerance).\n"
            "ONNX needs the optional dependencies: pip install 'vitlab[onnx]'.\n\n"
            "examples:\n"
            "  vitlab export --model runs/cifar --format onnx      # writes runs/cifar/model.onnx\n"
            "  vitlab export --model vit_s16 --format torchscript --out vit_s16.pt"
        ),
        formatter_class=formatter,
    )
    add_model_arg(p)
    p.add_argument("--format", choices=["onnx", "torchscript"], default="onnx")
    p.add_argument(
        "--out",
        default=None,
        help="output file (default: model.onnx / model.pt next to the model; <name>.onnx here for a name)",
    )
    p.add_argument("--opset", type=int, default=18, help="ONNX opset")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max |exported - PyTorch| logit difference")
    p.add_argument("--no-check", action="store_true", help="skip the parity check")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .._fs import writes_onto
    from ..errors import ConfigError
    from ..export import export_model, export_path
    from ._common import default_output, resolve_model

    ext = ".onnx" if args.format == "onnx" else ".pt"
    own = f"model{ext}"  # the export's own file next to the model: an earlier export, replaceable with --overwrite
    out = args.out or default_output(args.model, own) or f"{args.model.replace('/', '_')}{ext}"
    target = export_path(out, format=args.format)
    ours = Path(args.model).is_dir() and target.resolve() == (Path(args.model) / own).resolve()
    if not ours and writes_onto([target], args.model):  # checked before loading: fail in a second, destroy nothing
        raise ConfigError(f"--out {target}: is the input model {args.model} or a file in it; choose another --out")
    if target.exists() and not args.overwrite:
        raise ConfigError(f"--out {target}: already exists; pass --overwrite to replace it")
    model, _ = resolve_model(args.model)
    res = export_model(
        model,
        target,
        format=args.format,
        check=not args.no_check,
        tolerance=args.tolerance,
        opset=args.opset,
        overwrite=args.overwrite,
    )
    check = f", max |diff| vs PyTorch {res.max_abs_diff:.1e}" if res.max_abs_diff is not None else ""
    print(f"wrote {res.path} ({res.format}, dynamic batch, {res.seconds:.1f} s{check})")
    return 0
