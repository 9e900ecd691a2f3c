"""``vitlab data pack``: an ImageFolder as WebDataset-style tar shards with a manifest."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "data",
        help="pack an image folder into tar shards (WebDataset layout) with a manifest",
        description=(
            "Pack an ImageFolder (train/<class>/*, val/<class>/*, or one class tree) into tar shards of the\n"
            "original encoded files plus their class index (<key>.jpg + <key>.cls, the WebDataset layout),\n"
            "shuffled, with OUT/manifest.json: class names, samples, bytes, per-class counts and SHA-256 per\n"
            "shard. Each file is decoded once as it is packed: files that cannot be used are left out and listed\n"
            "in OUT/bad_files.txt (--strict-data: refused); links to files outside SRC are not followed.\n"
            "Train and evaluate from them with --data OUT (streamed, decoded at full resolution,\n"
            "not cached; docs/scale.md).\n\n"
            "example:\n  vitlab data pack ~/photos shards/ --shard-size 1GB\n"
            "  vitlab train --data shards/ --img-size 224"
        ),
        formatter_class=formatter,
    )
    p.add_argument("action", choices=["pack"], help="pack: write the shards")
    p.add_argument("src", help="image folder to pack")
    p.add_argument("out", help="folder for the shards and manifest.json (new, or one without shards)")
    p.add_argument("--shard-size", default="1GB", help="files per shard, in bytes: 1GB, 500MB, 256MiB")
    p.add_argument("--seed", type=int, default=0, help="shuffle of the samples before packing")
    p.add_argument(
        "--strict-data",
        action="store_true",
        help="stop at the first file that cannot be packed (default: leave it out and list it in OUT/bad_files.txt)",
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
        help="replace the shards and manifest.json a pack wrote in OUT (a manifest.json vitlab did not write stops it; "
        "nothing else there is deleted)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .._text import shown
    from .._units import counted, format_size, size_option
    from ..data.shards.manifest import MANIFEST
    from ..data.shards.write import pack_folder
    from ..errors import ConfigError

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
    print(f"{classes}; manifest: {shown(manifest)}; train from it: --data {shown(args.out)}")
    return 0
