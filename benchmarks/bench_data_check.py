"""The data check's near-copy rule measured on photos (issue 59, docs/data_check.md): its false positives over every
pair of distinct photos of a folder, its recall on copies made from them (re-encoded at JPEG quality 60-90, resized
0.5-0.9x, cropped 2-5% per side, each side drawn apart, mirrored left to right, greyscale), for a grid of hash
distances and thumbnail correlations around the chosen pair (``NEAR_BITS``, ``MIN_CORRELATION`` of
``vitlab.data.check.perceptual``; ``+`` marks ``SURE_CORRELATION``, the sure copies ``--strict-data`` stops on), and
the speed of the pass over the files (read once, hashed, decoded at a reduced DCT scale, fingerprinted) and of the
pair search.

Run it alone on the machine (2 cores: ``taskset -c 0,1``), it reads every file of ``--data``:

    taskset -c 0,1 python benchmarks/bench_data_check.py --data /work/shared/data/clothing --copies 300
    python benchmarks/bench_data_check.py --data /work/shared/data/clothing --limit 200 --copies 20  # a quick look
    python benchmarks/bench_data_check.py --smoke                                                  # seconds

Output: one markdown table (per grid point: pairs of distinct photos passing, their rate, the pairs passing were the
second photo of each greyscale (the rule compares such a pair by luma alone), recall per kind of copy;
``*`` marks the chosen point), the pairs of distinct photos the chosen rule calls copies (look at them: a folder
may hold real near copies, which are no false positives), the speed rows, and one JSON line of everything.
Byte-identical files of the folder are counted apart (exact copies, found by their content hash), never as false
positives. Distinct photos = different content hashes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
from _common import Stopwatch, data_check_perceptual, data_check_records, photo_pixels

BITS = (8, 10, 12, 14, 16)
CORRELATIONS = (0.0, 0.90, 0.93, 0.95, 0.97, 0.98, 0.99)
KINDS = ("reencoded", "resized", "cropped", "mirrored", "greyscale")
EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")


def photo_files(root: Path, limit: int | None) -> list[Path]:
    """Every image file under ``root`` (sorted), the first ``limit`` of an evenly spread sample when given."""
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in EXTENSIONS and p.is_file())
    if limit is not None and limit < len(files):
        files = [files[int(i)] for i in np.linspace(0, len(files) - 1, limit).round()]
    return files


def fingerprints(paths: list[Path], root: Path, *, workers: int) -> tuple[list, object, float]:
    """``(records, fingerprints, seconds)`` of the data check's own pass over ``paths`` (nothing kept between runs)."""
    recs = [data_check_records.FileRecord(str(p), str(p), "x", 0) for p in paths]
    clock = Stopwatch()
    fps = data_check_records.read_files(recs, root=root, workers=workers, progress=True, cache_dir=None)
    return recs, fps, clock.elapsed()


def make_copies(originals: list[Path], out: Path, seed: int) -> dict[str, list[tuple[int, Path]]]:
    """For each original, five copies under ``out``: ``reencoded`` (JPEG quality 60-90), ``resized`` (0.5-0.9x,
    bicubic, JPEG 90), ``cropped`` (2-5% off each side, drawn apart, JPEG 90), ``mirrored`` (left to right, JPEG
    90) and ``greyscale`` (PIL's luma, a one-channel JPEG 90): ``kind -> [(original, path)]``."""
    from PIL import Image, ImageOps

    rng = np.random.default_rng(seed)
    made: dict[str, list[tuple[int, Path]]] = {k: [] for k in KINDS}
    for k, p in enumerate(originals):
        with Image.open(p) as im:
            im = ImageOps.exif_transpose(im).convert("RGB")
        w, h = im.size
        q = int(rng.integers(60, 91))
        s = float(rng.uniform(0.5, 0.9))
        left, top, right, bottom = rng.uniform(0.02, 0.05, 4)
        variants = {
            "reencoded": (im, q),
            "resized": (im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.Resampling.BICUBIC), 90),
            "cropped": (im.crop((round(w * left), round(h * top), w - round(w * right), h - round(h * bottom))), 90),
            "mirrored": (ImageOps.mirror(im), 90),
            "greyscale": (ImageOps.grayscale(im), 90),
        }
        for kind, (copy, quality) in variants.items():
            path = out / f"{k:05d}-{kind}.jpg"
            copy.save(path, "JPEG", quality=quality)
            made[kind].append((k, path))
    return made


def distances(fps_a, ia: np.ndarray, fps_b, ib: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hash distance (the smallest of whole-whole, whole-centre, centre-whole, whole-mirror) and thumbnail correlation
    of pairs ``(ia[k] of fps_a, ib[k] of fps_b)``, as the check measures them."""
    perceptual = data_check_perceptual
    wa, ca, wb, cb = fps_a.whole[ia], fps_a.centre[ia], fps_b.whole[ib], fps_b.centre[ib]
    d = np.minimum(np.minimum(perceptual.hamming(wa, wb), perceptual.hamming(wa, cb)), perceptual.hamming(ca, wb))
    d = np.minimum(d, perceptual.hamming(wa, fps_b.mirror[ib]))
    thumbs = np.concatenate([fps_a.thumbs[ia], fps_b.thumbs[ib]])
    n = len(ia)
    r = perceptual.correlations(thumbs, np.arange(n), np.arange(n, 2 * n))
    return d, r


def smoke_folder(root: Path, n: int = 60) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    (root / "photos").mkdir(parents=True)
    for i in range(n):
        Image.fromarray(photo_pixels(rng, (160, 120))).save(root / "photos" / f"{i:03d}.jpg", quality=90)
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help="a folder of photos (every image file under it)")
    ap.add_argument("--limit", type=int, default=None, help="only this many files, evenly spread (default: all)")
    ap.add_argument("--copies", type=int, default=300, help="originals copied five ways for the recall")
    ap.add_argument("--workers", type=int, default=2, help="threads of the pass over the files (the check's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="60 generated pictures: that the script runs")
    args = ap.parse_args()
    perceptual = data_check_perceptual
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = smoke_folder(Path(tmp) / "smoke") if args.smoke else args.data
        if root is None:
            ap.error("--data DIR (or --smoke)")
        files = photo_files(root, 60 if args.smoke else args.limit)
        recs, fps, pass_s = fingerprints(files, root, workers=args.workers)
        ok = np.array([r.error is None for r in recs])
        idx = np.flatnonzero(ok)
        clock = Stopwatch()
        i, j, d = perceptual.hash_pairs(fps.whole[idx], fps.centre[idx], fps.mirror[idx], bits=max(BITS))
        search_s = clock.elapsed()
        r = perceptual.correlations(fps.thumbs[idx], i, j) if len(i) else np.zeros(0)
        # the same pairs were the second photo greyscale (its hash is its luma's, unchanged): compared by luma
        luma = np.round(fps.thumbs[idx].astype(np.float64) @ np.array([0.299, 0.587, 0.114]))
        greyed = np.concatenate([fps.thumbs[idx], np.repeat(luma[..., None], 3, axis=-1).astype(np.uint8)])
        r_grey = perceptual.correlations(greyed, i, j + len(idx)) if len(i) else np.zeros(0)
        i, j = idx[i], idx[j]
        exact = np.array([recs[a].digest == recs[b].digest for a, b in zip(i.tolist(), j.tolist())], dtype=bool)
        n = len(idx)
        pairs = n * (n - 1) // 2
        originals = [files[int(k)] for k in np.random.default_rng(args.seed).permutation(idx)[: args.copies]]
        copies_dir = Path(tmp) / "copies"
        copies_dir.mkdir()
        made = make_copies(originals, copies_dir, args.seed)
        _, orig_fps, _ = fingerprints(originals, root, workers=args.workers)
        recall_d: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for kind, rows in made.items():
            crecs, cfps, _ = fingerprints([p for _, p in rows], copies_dir, workers=args.workers)
            good = np.array([c.error is None for c in crecs])
            ia = np.array([k for k, _ in rows])[good]
            recall_d[kind] = distances(orig_fps, ia, cfps, np.flatnonzero(good))
    chosen = (perceptual.NEAR_BITS, perceptual.MIN_CORRELATION)
    sure = (perceptual.NEAR_BITS, perceptual.SURE_CORRELATION)
    print(f"\n{n:,} photos ({len(recs) - n} unreadable), {pairs:,} pairs; {int(exact.sum())} byte-identical "
          "pairs (exact copies in the folder, not counted below); "
          f"{len(originals)} originals copied five ways\n")  # fmt: skip
    print("| bits | min r | distinct pairs passing | rate | passing, one side greyscale | recall re-encoded "
          "| recall resized | recall cropped | recall mirrored | recall greyscale |\n"
          "|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    rows = []
    for bits in BITS:
        for corr in CORRELATIONS:
            passing = int(((d <= bits) & (r >= corr) & ~exact).sum())
            grey_passing = int(((d <= bits) & (r_grey >= corr) & ~exact).sum())
            rec = {k: float(((dd <= bits) & (rr >= corr)).mean()) if len(dd) else float("nan")
                   for k, (dd, rr) in recall_d.items()}  # fmt: skip
            mark = " *" if (bits, corr) == chosen else " +" if (bits, corr) == sure else ""
            recalls = " | ".join(f"{rec[k]:.3f}" for k in KINDS)
            print(f"| {bits}{mark} | {corr:.2f} | {passing:,} | {passing / max(1, pairs):.2e} | {grey_passing:,} "
                  f"| {recalls} |")  # fmt: skip
            rows.append({"bits": bits, "min_correlation": corr, "false_pairs": passing,
                         "false_rate": passing / max(1, pairs), "false_pairs_greyscale": grey_passing,
                         "recall": rec})  # fmt: skip
    flagged = (d <= chosen[0]) & (r >= chosen[1]) & ~exact
    print(
        f"\ndistinct pairs the chosen rule ({chosen[0]} bits, r >= {chosen[1]}) calls copies: {int(flagged.sum())} "
        "(the 20 closest)"
    )
    for a, b, dd, rr in sorted(zip(i[flagged], j[flagged], d[flagged], r[flagged]), key=lambda x: -x[3])[:20]:
        print(f"  {dd:2d} bits r={rr:.3f}  {files[a]}  {files[b]}")
    per_min = 60 * n / max(pass_s, 1e-9)
    print(f"\npass over the files: {len(recs):,} files in {pass_s:.1f} s = {per_min:,.0f} images/min "
          f"({args.workers} threads); pair search ({max(BITS)} bits): {search_s:.2f} s")  # fmt: skip
    for kind, (dd, rr) in recall_d.items():
        if len(rr):
            print(
                f"{kind}: thumbnail r of the copies within {chosen[0]} bits: 5th percentile "
                f"{np.percentile(rr[dd <= chosen[0]], 5):.3f}, median {np.median(rr[dd <= chosen[0]]):.3f}"
            )
    print(json.dumps({"photos": n, "pairs": pairs, "exact_pairs": int(exact.sum()), "copies": len(originals),
                      "grid": rows, "pass_s": pass_s, "images_per_min": per_min, "search_s": search_s,
                      "workers": args.workers, "chosen": list(chosen)}))  # fmt: skip
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
