"""``vitlab data pack``: an ImageFolder as WebDataset-style tar shards with a manifest; ``vitlab data check``: what is
wrong with an ImageFolder before a model trains on it (:mod:`vitlab.data.check`)."""

from __future__ import annotations

import argparse

from ._common import add_progress_arg
from ._labels import add_label_args, label_lines, run_label_check


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "data",
        help="check an image folder (copies, leaks, conflicting labels, unreadable ...) or pack it into tar shards",
        description=(
            "check: read every file of an ImageFolder once (train/<class>/* with val/ or test/, or one class tree:\n"
            "the folders vitlab train --data reads) and report what would mislead a model trained on it:\n"
            "files that cannot be used, tiny images, strips, the same picture twice in a class, the same picture\n"
            "under two classes, evaluation images also in train/ (byte-identical or near copies: re-encoded,\n"
            "resized, slightly cropped, mirrored) and classes far smaller than the others (docs/data_check.md).\n"
            "A summary, or with --json the report (paths relative to DIR); vitlab train runs the same check first.\n\n"
            "pack: pack an ImageFolder (train/<class>/*, val/<class>/*, or one class tree) into tar shards of the\n"
            "original encoded files plus their class index (<key>.jpg + <key>.cls, the WebDataset layout),\n"
            "shuffled, with OUT/manifest.json: class names, samples, bytes, per-class counts and SHA-256 per\n"
            "shard. Each file is decoded once as it is packed: files that cannot be used are left out and listed\n"
            "in OUT/bad_files.txt (--strict-data: refused); links to files outside DIR are not followed.\n"
            "Train and evaluate from them with --data OUT (streamed, decoded at full resolution,\n"
            "not cached; docs/scale.md).\n\n"
            "examples:\n  vitlab data check ~/photos\n  vitlab data check ~/photos --json > check.json\n"
            "  vitlab data pack ~/photos shards/ --shard-size 1GB    # or --out shards/\n"
            "  vitlab train --data shards/ --img-size 224"
        ),
        formatter_class=formatter,
    )
    p.add_argument(
        "action", choices=["check", "pack"], help="check: report the folder's problems; pack: write the shards"
    )
    p.add_argument("src", metavar="DIR", help="the image folder")
    p.add_argument(
        "out",
        nargs="?",
        default=None,
        metavar="OUT",
        help="pack: folder for the shards and manifest.json (new, or one without shards)",
    )
    p.add_argument("--out", dest="out_flag", default=None, metavar="OUT", help="pack: OUT, as every command's --out")
    p.add_argument("--json", action="store_true", help="check: print the report as JSON on stdout")
    p.add_argument(
        "--all-eval",
        action="store_true",
        help="check: compare train/ with every evaluation folder present (val/, test/ ...), not only the one a run "
        "evaluates on (the first of val, valid, validation, test)",
    )
    p.add_argument("--workers", type=int, default=2, metavar="N", help="check: threads reading the files")
    p.add_argument(
        "--cache-dir",
        default=None,
        help="check: where each file's hashes are kept for the next check (default ~/.cache/vitlab or $VITLAB_CACHE)",
    )
    p.add_argument("--shard-size", default="1GB", help="pack: files per shard, in bytes: 1GB, 500MB, 256MiB")
    p.add_argument("--seed", type=int, default=0, help="pack: shuffle of the samples before packing")
    p.add_argument(
        "--strict-data",
        action="store_true",
        help="pack: stop at the first file that cannot be packed (default: leave it out and list it in "
        "OUT/bad_files.txt); check: exit 2 on evaluation images also in train/ or pictures under two classes "
        "(sure copies: identical or re-encoded, not look-alikes)",
    )
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=None,
        metavar="N",
        help="leave out images with more pixels: a decompression-bomb guard (default: PIL's 89,478,485)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="pack: replace the shards and manifest.json a pack wrote in OUT (a manifest.json vitlab did not write "
        "stops it; nothing else there is deleted)",
    )
    add_progress_arg(p)
    add_label_args(p.add_argument_group("check --labels: label issues ranked from a model"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "check":
        return check(args)
    from ..errors import ConfigError

    if args.labels or args.model is not None:
        raise ConfigError("--labels and --model are options of vitlab data check, not of pack")
    from pathlib import Path

    from .._text import shell_word, shown
    from .._units import counted, format_size, size_option
    from ..data.shards.manifest import MANIFEST
    from ..data.shards.write import pack_folder
    from ..errors import ConfigError

    if args.out is not None and args.out_flag is not None and args.out != args.out_flag:
        raise ConfigError(f"vitlab data pack: OUT {args.out!r} and --out {args.out_flag!r} differ; give one")
    args.out = args.out if args.out is not None else args.out_flag
    if args.out is None:
        raise ConfigError("vitlab data pack DIR OUT (or --out OUT): OUT, the folder for the shards, is missing")
    shard_bytes = size_option("--shard-size", args.shard_size)
    if args.max_image_pixels is not None and args.max_image_pixels < 1:
        raise ConfigError(f"--max-image-pixels {args.max_image_pixels}: out of range")
    m = pack_folder(
        args.src,
        args.out,
        shard_bytes=shard_bytes,
        seed=args.seed,
        progress=not args.no_progress,
        strict=args.strict_data,
        overwrite=args.overwrite,
        max_pixels=args.max_image_pixels,
        log=lambda line: print(shown(line)),  # names from the folder, shown escaped
    )
    for split, s in m["splits"].items():
        total = sum(sh["bytes"] for sh in s["shards"])
        print(
            f"{split}: {counted(s['samples'], 'sample')} in {counted(len(s['shards']), 'shard')}, {format_size(total)}"
        )
    manifest = Path(args.out) / MANIFEST  # joined as a path: `--out shards/` gives shards/manifest.json
    classes = counted(len(m["classes"]), "class")
    print(f"{classes}; manifest: {shown(manifest)}; train from it: --data {shell_word(args.out)}")
    return 0


_EXAMPLES = 5
"""Findings of each kind a terminal summary lists."""


def _example(f) -> str:
    """One finding as a line of the terminal summary."""
    d = f.detail
    if "reason" in d:
        return f"{f.paths[0]}: {d['reason']}"
    if "size" in d:
        return f"{f.paths[0]} ({d['size'][0]}x{d['size'][1]})"
    if "counts" in d:
        return ", ".join(f"{p} {n:,}" for p, n in zip(f.paths, d["counts"].values()))
    names = [f"{p} ({c})" for p, c in zip(f.paths, d["classes"])] if "classes" in d else list(f.paths)
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return f"{' = '.join(names[:4])}{more} ({d.get('match', '')})"


def check(args: argparse.Namespace) -> int:
    """``vitlab data check DIR``: the summary (or ``--json``: the report) of :func:`vitlab.data.check.check_folder`."""
    import json
    import sys
    from pathlib import Path

    from .._text import shown
    from .._units import counted
    from ..data.check import KINDS, check_folder
    from ..data.images.scan import labels_file_hint
    from ..errors import ConfigError, DataError

    if args.out is not None:
        raise ConfigError(f"vitlab data check DIR takes one folder; {args.out!r} is one too many")
    if args.out_flag is not None:
        raise ConfigError("--out is an option of vitlab data pack; check prints its report (--json: as JSON)")
    for flag in ("shard_size", "seed", "overwrite"):
        if getattr(args, flag) != {"shard_size": "1GB", "seed": 0, "overwrite": False}[flag]:
            raise ConfigError(f"--{flag.replace('_', '-')} is an option of vitlab data pack, not of check")
    if args.max_image_pixels is not None and args.max_image_pixels < 1:
        raise ConfigError(f"--max-image-pixels {args.max_image_pixels}: out of range")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: at least 1")
    root = Path(args.src).expanduser()
    if not root.is_dir():
        raise DataError(f"{args.src}: not a folder (vitlab data check reads an ImageFolder){labels_file_hint(root)}")
    from ..data.cache.store import default_cache_dir

    result = check_folder(
        root,
        every_eval=args.all_eval,
        workers=args.workers,
        progress=not args.no_progress,
        max_pixels=args.max_image_pixels,
        cache_dir=Path(args.cache_dir) if args.cache_dir else default_cache_dir(),
    )
    labels = run_label_check(args, root)  # none without --labels
    if args.json:
        report = result.report()
        report["findings"] += labels
        report["counts"]["label_issue"] = len(labels)
        print(json.dumps(report, indent=1))
    else:
        n = len(result.records)
        splits = [f for f in result.folders.values() if f]
        print(f"{shown(root)}: {n:,} image file(s) in {counted(len(result.class_names), 'class')}, "
              + (f"splits {', '.join(splits)}" if splits else "one class tree (no train/ and val/)"))  # fmt: skip
        for line in result.lines():
            print(shown(line.removeprefix("data check: ")))
        for kind in KINDS:
            found = result.of(kind)
            for f in found[:_EXAMPLES]:
                print(shown(f"  {kind}: {_example(f)}"))
            if len(found) > _EXAMPLES:
                print(f"  {kind}: and {len(found) - _EXAMPLES:,} more (--json lists them all)")
        if args.labels:
            for line in label_lines(labels):
                print(line)
    if args.strict_data and (why := result.refusal()):
        print(f"vitlab data check: error: {shown(why)} (--strict-data)", file=sys.stderr)
        return 2
    return 0
