"""``vitlab convert SRC DST``: any supported checkpoint -> vitlab's folder format, Google's ``.npz``, or another
library's layout (``--layout timm|hf|meta``, :mod:`vitlab.checkpoints.layouts`)."""

from __future__ import annotations

import argparse

from .._units import counted


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a checkpoint between vitlab's, timm's, Hugging Face's, Meta's and Google's layouts",
        description=(
            "Read a checkpoint in any supported format (timm .pth/.bin/.safetensors, a Hugging Face\n"
            "save_pretrained folder, a Google .npz of vit_jax or big_vision, a vitlab folder, or a\n"
            "known public name) and write it as DST/model.safetensors + DST/config.json, or, when DST\n"
            "ends in .npz, as Google's .npz (--layout vit_jax or big_vision) with vitlab's config in an extra\n"
            "array, so that converting back gives the same model (options without a Google layout are refused).\n"
            "--layout timm|hf|meta writes it in another library's layout instead, loadable there strictly with the\n"
            "same outputs: timm (DST/model.safetensors + timm's config.json, or DST.safetensors alone), Hugging\n"
            "Face's ViTForImageClassification (a save_pretrained folder whose images pipeline() preprocesses as\n"
            "vitlab does) or DINOv3ViTModel, Meta's DINOv3 release keys (DST.pth or a folder). A position table\n"
            "those classes have no place for (sine-cosine, 2-D) is written as the learned table it equals at the\n"
            "model's size.\n\n"
            "The architecture is inferred from the tensor shapes; the head count comes from the\n"
            "paper's table (width -> heads) unless the format stores it or --num-heads says.\n"
            "Known names (downloaded with huggingface_hub): <tag>/<model>, e.g.\n"
            "augreg_in21k_ft_in1k/vit_b16, augreg_in21k/vit_l16, orig_in21k/vit_h14, google/vit_b16_384.\n\n"
            "examples:\n"
            "  vitlab convert ViT-B_16.npz out/vit_b16\n"
            "  vitlab convert hf_vit_folder/ out/vit_hf --img-size 384\n"
            "  vitlab convert augreg_in21k_ft_in1k/vit_b16 out/b16 --num-classes 10   # new zero head for fine-tuning\n"
            "  vitlab convert out/vit_b16 vit_b16.npz --layout big_vision\n"
            "  vitlab convert hf_dinov3_folder/ out/dinov3_timm --layout timm    # timm's vit_*_patch16_dinov3_qkvb\n"
            "  vitlab convert dinov3_vits16_pretrain.pth out/dinov3_hf --layout hf  # Meta's release -> Hugging Face\n"
            "  vitlab convert runs/X out/x_hf --layout hf     # a run's model -> transformers' pipeline()"
        ),
        formatter_class=formatter,
    )
    p.add_argument("src", help="checkpoint file, folder or known name")
    p.add_argument("dst", help="output folder")
    p.add_argument("--img-size", type=int, default=None, help="resample position embeddings to this resolution")
    p.add_argument("--act", choices=["gelu", "gelu_tanh"], default=None, help="override the activation")
    p.add_argument(
        "--num-heads", type=int, default=None, help="override the head count (inferred from the paper's table)"
    )
    p.add_argument(
        "--num-classes", type=int, default=None, help="replace the classifier by a fresh zero-initialised one"
    )
    p.add_argument(
        "--no-strict", action="store_true", help="load what fits and warn about the rest, instead of failing"
    )
    p.add_argument("--patch-size", type=int, default=None, help="resize the patch projection (FlexiViT)")
    p.add_argument(
        "--layout",
        choices=["vit_jax", "big_vision", "timm", "hf", "meta"],
        default=None,
        help="vit_jax (default) or big_vision for a DST ending in .npz; timm, hf or meta: another library's layout "
        "(default: a vitlab folder)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a vitlab model already in DST (never another program's config.json)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from .._fs import refuse_blocked, writes_onto
    from ..checkpoints import load, save
    from ..checkpoints.layouts import LAYOUTS, layout_files, write_layout
    from ..checkpoints.npz import CONFIG_KEY
    from ..checkpoints.npz_write import outside_layout, write_npz
    from ..checkpoints.vitlab_folder import CONFIG_NAME, WEIGHTS_NAME
    from ..errors import ConfigError

    dst = Path(args.dst)
    layout = args.layout
    if dst.suffix == ".npz":
        layout = layout or "vit_jax"
        if layout in LAYOUTS:
            raise ConfigError(f"--layout {layout}: writes timm's, Hugging Face's or Meta's files, not an .npz")
        files = [dst]
    elif layout in LAYOUTS:
        files = layout_files(dst, layout)
    elif layout is not None:
        raise ConfigError(f"--layout {layout}: Google's .npz layouts need a DST ending in .npz")
    else:
        files = [dst / WEIGHTS_NAME, dst / CONFIG_NAME]
    same = Path(args.src).exists() and dst.exists() and dst.resolve() == Path(args.src).resolve()
    if same or writes_onto(files, args.src):  # checked before loading: fail in a second, destroy nothing
        raise ConfigError(f"{dst}: would overwrite the input {args.src}; convert into another folder")
    for f in files:
        refuse_blocked(f, what=f"the converted {f.name}")
    held = [f.name for f in files if f.exists()]
    if held and not args.overwrite:
        raise ConfigError(f"{dst}: already holds a model ({', '.join(held)}); pass --overwrite to replace it")

    pairs = (
        ("img_size", args.img_size),
        ("act", args.act),
        ("num_heads", args.num_heads),
        ("num_classes", args.num_classes),
        ("patch_size", args.patch_size),
    )
    overrides = {k: v for k, v in pairs if v is not None}
    model = load(args.src, strict=not args.no_strict, **overrides)
    if layout in LAYOUTS:
        out, notes = write_layout(model, dst, layout=layout, overwrite=args.overwrite)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    elif dst.suffix == ".npz":
        out = write_npz(model, dst, layout=layout, overwrite=args.overwrite)
        lost = outside_layout(model.config)
        if lost:  # vitlab reads them back; a reader of the plain layout would not
            has, kept = ("has", "it is") if len(lost) == 1 else ("have", "they are")
            print(
                f"note: {out}: {', '.join(lost)} {has} no place in the {layout} layout; {kept} kept in its "
                f"{CONFIG_KEY} array, which vitlab reads back and other readers ignore (they assume the official "
                "models' tanh-GELU, inputs in [-1, 1] and 224 px)",
                file=sys.stderr,
            )
    else:
        out = save(model, dst, extra={"converted_from": str(args.src)}, overwrite=args.overwrite)
    cfg = model.config
    print(
        f"wrote {out} ({cfg.name}: {counted(cfg.depth, 'layer')}, width {cfg.embed_dim}, "
        f"{sum(p.numel() for p in model.parameters()):,} params)"
    )
    return 0
