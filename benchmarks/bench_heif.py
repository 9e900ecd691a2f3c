"""HEIC against JPEG through the one decoder (docs/training.md, "Photos"): what reading an iPhone's format costs a
run's first pass over a folder (the decode cache decodes each file once) and the data check.

The same photos (every ``--every``-th of ``--data``, up to ``--photos``, EXIF orientation applied) are saved both ways
at quality 90 (HEIC by ``pillow-heif``'s encoder, JPEG by PIL's) in a temporary folder; each format's files are
then decoded by vitlab's decoder as a training folder's file is (``shorter_side``: the decode cache's storage side
for 224 px training, 256), one format after the other in alternating order each round (``vitlab.bench.time_calls``).
Prints the milliseconds per photo (median of the rounds) and the bytes on disk. Needs the ``heif`` extra.

    python benchmarks/bench_heif.py --data ../shared/data/clothing --photos 100
    python benchmarks/bench_heif.py --smoke      # 6 generated photos, 2 rounds: that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
from _common import decode_image, photo_pixels

from vitlab.bench import time_calls


def make_copies(photos: list[Path] | list[np.ndarray], out: Path) -> dict[str, list[Path]]:
    """Each photo (a file, EXIF applied, or pixels) saved under ``out`` as HEIC and as JPEG, both at quality 90."""
    import pillow_heif
    from PIL import Image, ImageOps

    pillow_heif.register_heif_opener()
    made: dict[str, list[Path]] = {"jpeg": [], "heic": []}
    for i, p in enumerate(photos):
        if isinstance(p, Path):
            with Image.open(p) as im:
                im = ImageOps.exif_transpose(im).convert("RGB")
        else:
            im = Image.fromarray(p)
        for fmt, ext in (("jpeg", "jpg"), ("heic", "heic")):
            path = out / f"{i:04d}.{ext}"
            im.save(path, format="HEIF" if fmt == "heic" else "JPEG", quality=90)
            made[fmt].append(path)
    return made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help="a folder of photos (every .jpg under it, sorted)")
    ap.add_argument("--photos", type=int, default=100)
    ap.add_argument("--every", type=int, default=30, help="take every N-th file, spread over the classes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shorter-side", type=int, default=256, help="the decode cache's storage side (0: full size)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    if args.smoke:
        rng = np.random.default_rng(0)
        photos: list = [photo_pixels(rng, (160, 120)) for _ in range(6)]
        args.rounds = 2
    elif args.data is None:
        ap.error("--data DIR (or --smoke)")
    else:
        photos = sorted(args.data.rglob("*.jpg"))[:: args.every][: args.photos]
    side = args.shorter_side or None
    with tempfile.TemporaryDirectory() as tmp:
        made = make_copies(photos, Path(tmp))
        decode_image(made["heic"][0])  # the HEIF opener registered before anything is timed
        calls = {fmt: (lambda files=files: [decode_image(f, shorter_side=side) for f in files])
                 for fmt, files in made.items()}  # fmt: skip
        times = time_calls(calls, rounds=args.rounds, warmup=1)
        sizes = {fmt: sum(f.stat().st_size for f in files) for fmt, files in made.items()}
        shape = decode_image(made["jpeg"][0], shorter_side=side).shape
    n = len(photos)
    ms = {fmt: 1000 * times[fmt].median / n for fmt in made}
    print(f"\n{n} photos (the first decodes to {shape[1]}x{shape[0]}), shorter side {side or 'as stored'}, "
          f"median of {args.rounds} rounds\n")  # fmt: skip
    print("| format | ms per photo | vs JPEG | MB on disk |\n|---|---:|---:|---:|")
    for fmt in made:
        print(f"| {fmt} | {ms[fmt]:.2f} | {ms[fmt] / ms['jpeg']:.1f}x | {sizes[fmt] / 1e6:.1f} |")
    print(json.dumps({"photos": n, "shorter_side": side, "ms_per_photo": ms, "bytes": sizes}))
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
