"""``vitlab models``: the names vitlab takes for a model (its architectures, timm's names, the public checkpoints)
and the table of the architectures, filtered as ``timm.list_models(pattern, pretrained=...)`` filters."""

from __future__ import annotations

import argparse
import fnmatch
import json

from ..errors import CheckpointError, ConfigError


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "models",
        help="list model names (vitlab's, timm's, public checkpoints) with layers, width, params and GFLOPs",
        description=(
            "List the names a model argument takes: the registered architectures (the paper's Table 1 and more)\n"
            "with layers, width, MLP, heads, parameters and GFLOPs; the timm names create_model accepts; and the\n"
            "public checkpoints vitlab.load, --init and --model download by name.\n\n"
            "examples:\n"
            "  vitlab models --img-size 384\n"
            "  vitlab models '*s16*'              # names matching a pattern (as timm.list_models)\n"
            "  vitlab models --pretrained 'augreg*'  # only names with public weights"
        ),
        formatter_class=formatter,
    )
    p.add_argument(
        "pattern", nargs="?", default=None, help="shell-style pattern the names must match: '*s16*', 'deit_*'"
    )
    p.add_argument("--pretrained", action="store_true", help="only names with public weights")
    p.add_argument("--img-size", type=int, default=224, help="resolution for the params/GFLOPs columns")
    p.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="classes of the head in the params column (default: each model's own: 1000, or timm's for its names)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def model_table(
    img_size: int = 224, num_classes: int | None = None, names: list[str] | None = None
) -> list[dict[str, object]]:
    """One row per registered model (or per name of ``names``), from the config ``create_model`` would build and its
    arithmetic (``ViTConfig.num_params``, ``count_macs``): nothing is built. ``num_classes`` None: each model's own
    head (1000 classes, or timm's head for its backbones' names)."""
    from ..models import count_macs, list_models, registered_config

    rows = []
    for name in list_models() if names is None else names:
        cfg = registered_config(name, num_classes=num_classes, img_size=img_size)
        macs = count_macs(cfg)
        rows.append(
            {
                "name": name,
                "layers": cfg.depth,
                "width": cfg.embed_dim,
                "mlp": cfg.mlp_dim,
                "heads": cfg.num_heads,
                "patch": cfg.patch_size,
                "params": cfg.num_params(),
                "gmacs": round(macs / 1e9, 2),
                "gflops": round(2 * macs / 1e9, 2),
            }
        )
    return rows


def _weights(name: str) -> str | None:
    """The public checkpoint ``create_model(name, pretrained=True)`` loads, or None."""
    from ..checkpoints.hub import pretrained_name

    try:
        return pretrained_name(name)
    except CheckpointError:
        return None


def name_rows(pattern: str | None = None, *, pretrained: bool = False) -> dict[str, list[dict[str, object]]]:
    """The names a model argument takes, matching the shell-style ``pattern`` (case ignored), by kind:
    ``architecture`` (vitlab's registered names), ``timm`` (timm's names, with the vitlab architecture each
    builds) and ``checkpoint`` (public weights, with their Hub repo). ``pretrained``: only the names that have
    public weights, with the checkpoint each loads (``create_model(name, pretrained=True)``)."""
    from ..checkpoints.hub import KNOWN
    from ..models import list_models
    from ..models.registry import TIMM_ALIASES

    def wanted(name: str) -> bool:
        return pattern is None or fnmatch.fnmatchcase(name.lower(), pattern.lower())

    def weights(name: str) -> dict[str, object]:
        return {"pretrained": _weights(name)} if pretrained else {}

    archs = [{"name": n, **weights(n)} for n in list_models() if wanted(n)]
    timm = [{"name": n, "model": ours, **weights(n)} for n, (ours, _) in TIMM_ALIASES.items() if wanted(n)]
    ckpts = [
        {"name": n, "repo": e.repo_id, "format": e.kind, "model": n.split("/", 1)[1]}
        for n, e in sorted(KNOWN.items())
        if wanted(n)
    ]
    if pretrained:
        archs = [r for r in archs if r["pretrained"]]
        timm = [r for r in timm if r["pretrained"]]
    return {"architecture": archs, "timm": timm, "checkpoint": ckpts}


def run(args: argparse.Namespace) -> int:
    names = name_rows(args.pattern, pretrained=args.pretrained)
    if not any(names.values()):
        which = "with public weights " if args.pretrained else ""
        raise ConfigError(f"no model name {which}matches {args.pattern!r}; `vitlab models` lists them all")
    table = model_table(args.img_size, args.num_classes, [str(r["name"]) for r in names["architecture"]])
    for row, arch in zip(table, names["architecture"]):
        row.update(arch)
    if args.json:
        rows = [{"kind": "architecture", **r} for r in table]
        rows += [{"kind": kind, **r} for kind in ("timm", "checkpoint") for r in names[kind]]
        print(json.dumps(rows, indent=2))
        return 0
    if table:
        weights = "   public weights" if args.pretrained else ""
        w = max(16, *(len(str(r["name"])) + 1 for r in table))  # (timm's names of the backbones are long)
        print(
            f"{'name':<{w}}{'layers':>7}{'width':>7}{'mlp':>7}{'heads':>6}{'patch':>6}{'params':>14}{'GFLOPs':>9}   "
            f"(at {args.img_size} px; GFLOPs = 2 x GMACs){weights}",
        )
        for r in table:
            print(
                f"{r['name']:<{w}}{r['layers']:>7}{r['width']:>7}{r['mlp']:>7}{r['heads']:>6}{r['patch']:>6}"
                f"{r['params']:>14,}{r['gflops']:>9.1f}" + (f"   {r['pretrained']}" if args.pretrained else ""),
            )
    if names["timm"]:
        what = "the public weights create_model(name, pretrained=True) loads" if args.pretrained else "its vitlab model"
        print(f"\ntimm names (create_model, --model), each with {what}")
        width = max(len(str(r["name"])) for r in names["timm"]) + 2
        for r in names["timm"]:
            print(f"  {r['name']:<{width}}{r['pretrained'] if args.pretrained else r['model']}")
    if names["checkpoint"]:
        print(
            "\npublic checkpoints (vitlab.load, --init, --model; downloaded when used), each with its Hub repo",
        )
        width = max(len(str(r["name"])) for r in names["checkpoint"]) + 2
        for r in names["checkpoint"]:
            print(f"  {r['name']:<{width}}{r['repo']}")
    return 0
