"""``vitlab models``: the table of registered architectures."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "models",
        help="list model names with layers, width, MLP, heads, params and GFLOPs",
        description=(
            "List the registered models (the paper's Table 1 and more).\n\nexample:\n  vitlab models --img-size 384"
        ),
        formatter_class=formatter,
    )
    p.add_argument("--img-size", type=int, default=224, help="resolution for the params/GFLOPs columns")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def model_table(img_size: int = 224, num_classes: int = 1000) -> list[dict[str, object]]:
    """One row per registered model; built on the meta device, so no memory is spent."""
    import torch

    from ..models import create_model, list_models

    rows = []
    for name in list_models():
        with torch.device("meta"):
            m = create_model(name, num_classes=num_classes, img_size=img_size)
        cfg = m.config
        macs = m.macs()
        rows.append(
            {
                "name": name,
                "layers": cfg.depth,
                "width": cfg.embed_dim,
                "mlp": cfg.mlp_dim,
                "heads": cfg.num_heads,
                "patch": cfg.patch_size,
                "params": m.num_params(),
                "gmacs": round(macs / 1e9, 2),
                "gflops": round(2 * macs / 1e9, 2),
            }
        )
    return rows


def run(args: argparse.Namespace) -> int:
    rows = model_table(args.img_size, args.num_classes)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'name':<16}{'layers':>7}{'width':>7}{'mlp':>7}{'heads':>6}{'patch':>6}{'params':>14}{'GFLOPs':>9}   "
        f"(at {args.img_size} px; GFLOPs = 2 x GMACs)"
    )
    for r in rows:
        print(
            f"{r['name']:<16}{r['layers']:>7}{r['width']:>7}{r['mlp']:>7}{r['heads']:>6}{r['patch']:>6}"
            f"{r['params']:>14,}{r['gflops']:>9.1f}"
        )
    return 0
