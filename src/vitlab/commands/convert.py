"""``vitlab convert SRC DST``: any supported checkpoint -> vitlab's folder format."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a timm / Hugging Face / npz checkpoint to a vitlab folder",
        description=(
            "Read a checkpoint in any supported format (timm .pth/.bin/.safetensors, a Hugging Face\n"
            "save_pretrained folder, a Google .npz of vit_jax or big_vision, a vitlab folder, or a\n"
            "known public name) and write it as DST/model.safetensors + DST/config.json.\n\n"
            "examples:\n"
            "  vitlab convert ViT-B_16.npz out/vit_b16\n"
            "  vitlab convert hf_vit_folder/ out/vit_hf --img-size 384"
        ),
        formatter_class=formatter,
    )
    p.add_argument("src", help="checkpoint file, folder or known name")
    p.add_argument("dst", help="output folder")
    p.add_argument("--img-size", type=int, default=None, help="resample position embeddings to this resolution")
    p.add_argument("--act", choices=["gelu", "gelu_tanh"], default=None, help="override the activation")
    p.add_argument("--num-heads", type=int, default=None, help="override the head count (inferred from the paper's table)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..checkpoints import load, save

    overrides = {k: v for k, v in (("img_size", args.img_size), ("act", args.act), ("num_heads", args.num_heads)) if v is not None}
    model = load(args.src, **overrides)
    out = save(model, args.dst)
    cfg = model.config
    print(f"wrote {out} ({cfg.name}: {cfg.depth} layers, width {cfg.embed_dim}, {sum(p.numel() for p in model.parameters()):,} params)")
    return 0
