"""The data check (issue 59): each kind of finding on generated folders, the near-copy thresholds on generated
pictures, the pair search against brute force, ``vitlab data check`` (summary, ``--json``, ``--strict-data``), the
hashes kept for the next check, and a run on a folder: its ``data check: leak`` line, ``data_check.json``,
``--strict-data`` and ``--dedup-eval``, and the report's section."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageOps

from vitlab.cli import main
from vitlab.data.check import KINDS, DataCheck, check_folder
from vitlab.data.check import records as records_mod
from vitlab.data.check.findings import copy_findings
from vitlab.data.check.perceptual import (
    MIN_CORRELATION,
    NEAR_BITS,
    SURE_CORRELATION,
    _dct_matrix,
    correlations,
    fingerprint,
    hamming,
    hash_pairs,
    near_pairs,
    phash,
)
from vitlab.data.check.records import FileRecord

TRAIN = ["--recipe", "digits", "--batch-size", "8", "--epochs", "1", "--img-size", "16", "--dim", "16", "--depth", "1",
         "--heads", "2", "--patch-size", "4", "--no-progress"]  # fmt: skip


def picture(seed: int, size: tuple[int, int] = (96, 72)) -> Image.Image:
    """A photo-like picture: a colour gradient and six filled shapes, all drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w] / max(w, h)
    base = np.stack([rng.uniform(0, 255) + rng.uniform(-120, 120) * x + rng.uniform(-120, 120) * y for _ in range(3)])
    im = Image.fromarray(np.clip(base.transpose(1, 2, 0), 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(im)
    for _ in range(6):
        x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
        box = (x0, y0, x0 + rng.uniform(8, w / 2), y0 + rng.uniform(8, h / 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)(box, fill=fill)
    return im


def reencoded(im: Image.Image, quality: int = 70) -> Image.Image:
    buf = io.BytesIO()
    im.convert("RGB").save(buf, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buf.getvalue()))


def resized(im: Image.Image, scale: float = 0.8) -> Image.Image:
    return im.resize((round(im.width * scale), round(im.height * scale)), Image.Resampling.BICUBIC)


def cropped(im: Image.Image, frac: float = 0.03) -> Image.Image:
    dx, dy = round(im.width * frac), round(im.height * frac)
    return im.crop((dx, dy, im.width - dx, im.height - dy))


def _folder(root: Path, *, per_class: int = 12, val_per_class: int = 3, size: tuple[int, int] = (96, 72)) -> Path:
    """``root/{train,val}/{a,b,c}/NN.jpg``: distinct pictures, none a copy of another."""
    for split, n, offset in (("train", per_class, 0), ("val", val_per_class, 500)):
        for c, name in enumerate("abc"):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(n):
                picture(1000 * c + offset + i, size).save(d / f"{i:02d}.jpg", quality=92)
    return root


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> Path:
    """A folder with one of every fault (and images of every mode that must not be one)."""
    root = _folder(tmp_path_factory.mktemp("check") / "photos")
    tr, va = root / "train", root / "val"
    shutil.copy(tr / "a" / "00.jpg", va / "a" / "copy0.jpg")  # byte copies: leaks
    shutil.copy(tr / "b" / "00.jpg", va / "b" / "copy1.jpg")
    reencoded(Image.open(tr / "a" / "01.jpg"), 70).save(va / "a" / "q70.png")  # re-encoded, stored losslessly
    reencoded(Image.open(tr / "c" / "01.jpg"), 70).save(va / "c" / "q70b.jpg", quality=70)
    resized(Image.open(tr / "a" / "02.jpg")).save(va / "a" / "small.jpg", quality=90)
    cropped(Image.open(tr / "a" / "03.jpg")).save(va / "a" / "crop.jpg", quality=90)
    ImageOps.mirror(Image.open(tr / "c" / "02.jpg")).save(va / "c" / "mirror.jpg", quality=90)  # training flips
    shutil.copy(tr / "b" / "04.jpg", tr / "c" / "from_b.jpg")  # the same picture under b and c
    shutil.copy(tr / "c" / "05.jpg", tr / "c" / "05_again.jpg")  # the same picture twice in c
    reencoded(Image.open(tr / "c" / "06.jpg"), 80).save(tr / "c" / "06_q80.jpg", quality=80)
    (tr / "a" / "empty.jpg").write_bytes(b"")
    (tr / "a" / "page.jpg").write_bytes(b"<html><body>not found</body></html>")
    data = (tr / "a" / "04.jpg").read_bytes()
    (tr / "a" / "truncated.jpg").write_bytes(data[: len(data) // 2])
    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(tr / "b" / "thumb.png")
    picture(9007, (400, 20)).save(tr / "b" / "strip.png")
    picture(9011).convert("CMYK").save(tr / "b" / "cmyk.jpg")
    picture(9012).convert("L").save(tr / "b" / "grey.png")
    picture(9013).convert("P").save(tr / "b" / "palette.png")
    Image.fromarray(np.asarray(picture(9014).convert("L")).astype(np.uint16) * 257).save(tr / "b" / "deep.png")
    return root


def _paths(check, kind: str) -> set[tuple[str, ...]]:
    return {f.paths for f in check.of(kind)}


def test_each_kind_is_found_and_decodable_modes_are_no_fault(faulty):
    check = check_folder(faulty, progress=False)
    assert {p for (p,) in _paths(check, "unreadable")} == {"train/a/empty.jpg", "train/a/page.jpg",
                                                            "train/a/truncated.jpg"}  # fmt: skip
    assert _paths(check, "tiny") == {("train/b/thumb.png",)}
    assert _paths(check, "extreme_aspect") == {("train/b/strip.png",)}
    (strip,) = check.of("extreme_aspect")
    assert strip.detail["size"] == [400, 20] and strip.detail["left_out"]  # over 10:1: a run leaves it out
    assert _paths(check, "conflict") == {("train/b/04.jpg", "train/c/from_b.jpg")}
    assert _paths(check, "duplicate") == {("train/c/05.jpg", "train/c/05_again.jpg"),
                                          ("train/c/06.jpg", "train/c/06_q80.jpg")}  # fmt: skip
    leaks = {f.paths: f.detail["match"] for f in check.of("leak")}
    assert leaks == {
        ("val/a/copy0.jpg", "train/a/00.jpg"): "identical",
        ("val/b/copy1.jpg", "train/b/00.jpg"): "identical",
        ("val/a/q70.png", "train/a/01.jpg"): "near",
        ("val/c/q70b.jpg", "train/c/01.jpg"): "near",
        ("val/a/small.jpg", "train/a/02.jpg"): "near",
        ("val/a/crop.jpg", "train/a/03.jpg"): "near",
        ("val/c/mirror.jpg", "train/c/02.jpg"): "near",
    }
    named = {p for f in check.findings for p in f.paths}
    assert not named & {"train/b/cmyk.jpg", "train/b/grey.png", "train/b/palette.png", "train/b/deep.png"}
    assert check.of("imbalance") == []
    assert check.leaked() == {str(faulty / p) for p in ("val/a/copy0.jpg", "val/b/copy1.jpg", "val/a/q70.png",
                              "val/c/q70b.jpg", "val/a/small.jpg", "val/a/crop.jpg", "val/c/mirror.jpg")}  # fmt: skip
    sure = {f.paths[0]: f.detail["sure"] for f in check.of("leak")}
    assert all(sure[p] for p in ("val/a/copy0.jpg", "val/b/copy1.jpg", "val/a/q70.png", "val/c/q70b.jpg",
                                 "val/a/small.jpg", "val/c/mirror.jpg"))  # fmt: skip
    assert all(f.detail["sure"] for f in check.of("conflict") + check.of("duplicate"))
    lines = check.lines(where="X")
    assert [line.split(":")[1].strip() for line in lines] == [k for k in KINDS if k != "imbalance"]
    assert "7 evaluation image(s) are also in train/ (2 identical, 5 near copies, 1 of them only similar" in lines[-1]
    assert not sure["val/a/crop.jpg"]  # a crop: reported, not sure


def test_strict_data_stops_on_sure_copies_only():
    """Near copies that only a crop or a look-alike could make (thumbnails correlated below SURE_CORRELATION:
    distinct garments on one bed cover) are reported, with how many, and --strict-data lets them pass; one sure
    pair (byte-identical or re-encoded) in the same group is enough to stop it."""
    records = [FileRecord(f"/d/{rel}", rel, rel.split("/")[0], label, (64, 64), f"h{n}")
               for n, (rel, label) in enumerate([("train/a/0.jpg", 0), ("train/b/1.jpg", 1), ("val/a/2.jpg", 0),
                                                 ("train/a/3.jpg", 0)])]  # fmt: skip
    roles = ["train", "train", "eval", "train"]
    group = np.array([0, 0, 0, 3])  # 0, 1 and 2 joined by near pairs
    alike = DataCheck(root=Path("/d"), records=records, class_names=["a", "b"], folders={"train": "train",
                      "val": "val"}, roles=roles, group=group, sure_group=np.arange(4), walk_problems=[],
                      findings=[])  # fmt: skip
    alike.findings = copy_findings(records, group, alike.class_names, roles=roles, sure_group=alike.sure_group)
    assert {f.kind for f in alike.findings} == {"conflict", "leak"}
    assert not any(f.detail["sure"] for f in alike.findings)
    assert alike.refusal() is None
    lines = alike.lines()
    assert "1 of them only similar (a crop or a look-alike" in lines[0] and "--strict-data lets them pass" in lines[0]
    sure = dataclasses.replace(alike, sure_group=np.array([0, 1, 0, 3]))  # 2 is a sure copy of 0, not of 1
    sure.findings = copy_findings(records, group, sure.class_names, roles=roles, sure_group=sure.sure_group)
    assert {f.kind: f.detail["sure"] for f in sure.findings} == {"conflict": False, "leak": True}
    assert sure.refusal() == "1 evaluation image(s) also in train/ (sure copies)"
    assert sure.report()["counts"]["sure"] == {"duplicate": 0, "conflict": 0, "leak": 1}


def test_one_file_linked_into_two_classes_is_a_conflict(tmp_path):
    """A class tree built with links (``ln -s``) that files one picture under two classes: the folder walk counts the
    file once, under the class reached first. Before: the check called the second path "unreadable: the same file as
    ...; counted once", --strict-data let it pass, and the picture was taught as the first class alone without a word
    of a conflict. A link inside its own class or from the evaluation split stays a path the walk left out."""
    root = _folder(tmp_path / "photos", per_class=6, val_per_class=2)
    tr = root / "train"
    (tr / "c" / "from_a.jpg").symlink_to(tr / "a" / "00.jpg")  # a's picture under c too
    (tr / "a" / "again.jpg").symlink_to(tr / "a" / "01.jpg")  # twice in a: counted once, as before
    (root / "val" / "b" / "seen.jpg").symlink_to(tr / "b" / "00.jpg")  # left out of the evaluation, as before
    check = check_folder(root, progress=False)
    (conflict,) = check.of("conflict")
    assert conflict.paths == ("train/a/00.jpg", "train/c/from_a.jpg")
    assert conflict.detail == {"classes": ["a", "c"], "match": "linked", "sure": True}
    assert _paths(check, "unreadable") == {("train/a/again.jpg",), ("val/b/seen.jpg",)}
    assert not check.of("leak")
    assert check.refusal() == "1 picture(s) under two or more classes (sure copies)"
    (line,) = [x for x in check.lines() if x.startswith("data check: conflict")]
    assert "1 of them one file linked into two classes): the run teaches a linked file as the class reached" in line


@pytest.mark.slow
def test_a_run_names_a_linked_copy_it_left_out_as_what_it_is(tmp_path, capsys):
    """Before: a second path to one file (a link inside its class, which the walk counts once) made a run say
    "skipped 1 file(s) that cannot be decoded", and --strict-data "1 file(s) cannot be decoded"."""
    root = _folder(tmp_path / "photos", per_class=6, val_per_class=2)
    (root / "train" / "a" / "again.jpg").symlink_to(root / "train" / "a" / "01.jpg")
    out = tmp_path / "run"
    assert main(["train", "--data", str(root), "--out", str(out), *TRAIN]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning: skipped")]
    assert line.startswith("warning: skipped 1 file(s) that cannot be used (e.g. ") and "decoded" not in line
    assert "again.jpg: the same file" in line
    argv = ["train", "--data", str(root), "--out", str(tmp_path / "strict"), "--strict-data", *TRAIN]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "1 file(s) cannot be used (--strict-data): " in err and "again.jpg: the same file as" in err


def test_an_imbalanced_class_and_a_near_empty_one(tmp_path):
    root = tmp_path / "tree"
    for name, n in (("big", 40), ("mid", 30), ("rare", 3)):
        (root / name).mkdir(parents=True)
        for i in range(n):
            picture(hash((name, i)) % 100_000, (32, 24)).save(root / name / f"{i}.png")
    check = check_folder(root, progress=False)
    (f,) = check.of("imbalance")
    assert f.paths == ("rare",) and f.detail["counts"] == {"rare": 3} and f.detail["largest"] == {"big": 40}
    assert check.held_out and check.of("leak") == []  # a tree: its evaluation split is the run's to hold out
    assert any(line.startswith("data check: imbalance: small classes in the folder: rare 3") for line in check.lines())
    assert any("rare 3 image(s), beside big 40 (mean" in line for line in check.lines())


def test_a_folder_of_small_classes_only_has_none_beside(tmp_path):
    """Every class under 5 images: the line named the largest small class "beside" itself ("a 1, b 1 image(s),
    beside a 1 (mean 1)")."""
    for name in "ab":
        (tmp_path / name).mkdir()
        picture(ord(name), (32, 24)).save(tmp_path / name / "0.png")
    (line,) = [x for x in check_folder(tmp_path, progress=False).lines() if "imbalance" in x]
    assert "small classes in the folder: a 1, b 1 image(s): their accuracy" in line and "beside" not in line


def test_the_thresholds_split_copies_from_distinct_pictures():
    """The thresholds, on generated pictures: every re-encoded (JPEG 60-90), resized (0.5-0.9x), cropped (2-5% a
    side) and mirrored (left to right, re-encoded) copy is within NEAR_BITS and correlates at least MIN_CORRELATION
    (the mirrored ones only through the mirror alignment); no two distinct pictures pass both.
    (Measured on photos: benchmarks/bench_data_check.py, docs/data_check.md.)"""
    rng = np.random.default_rng(0)
    originals = [picture(s) for s in range(120)]
    fps = [fingerprint(np.asarray(im)) for im in originals]
    copies = []
    for k, im in enumerate(originals[:48]):
        made = {0: reencoded(im, int(rng.integers(60, 91))), 1: resized(im, float(rng.uniform(0.5, 0.9))),
                2: cropped(im, float(rng.uniform(0.02, 0.05))),
                3: reencoded(ImageOps.mirror(im), 90)}[k % 4]  # fmt: skip
        copies.append((k, fingerprint(np.asarray(made.convert("RGB")))))
    for k, fp in copies:
        a = fps[k]
        d = min(hamming(a.whole, fp.whole), hamming(a.whole, fp.centre), hamming(a.centre, fp.whole))
        if k % 4 == 3:  # mirrored: the whole hashes are far, the mirror hash is near
            assert d > NEAR_BITS, (k, d)
            d = hamming(a.whole, fp.mirror)
        r = correlations(np.stack([a.thumbs, fp.thumbs]), np.array([0]), np.array([1]))[0]
        assert d <= NEAR_BITS and r >= MIN_CORRELATION, (k, d, r)
    whole, centre, mirror = (
        np.array([getattr(f, x) for f in fps], dtype=np.uint64) for x in ("whole", "centre", "mirror")
    )
    thumbs = np.stack([f.thumbs for f in fps])
    pairs = near_pairs(whole, centre, thumbs, mirror)
    assert len(pairs[0]) == 0, pairs


def test_a_greyscale_copy_is_a_sure_copy_and_a_greyscale_stranger_is_not(tmp_path):
    """A greyscale copy of a colour picture (a one-channel JPEG) has the picture's luma but not its RGB values: the
    RGB thumbnails correlated too little (0.41 of such copies of the clothing photos passed, docs/data_check.md), so
    a greyscale copy in val/ of a training photo was no leak. Compared by luma when either side is greyscale, each
    such copy is a sure copy, and no distinct picture, greyed, passes as a copy of another."""
    fps = [fingerprint(np.asarray(picture(s))) for s in range(120)]
    for k in range(24):
        grey = reencoded(ImageOps.grayscale(picture(k)).convert("RGB"), 90).convert("L")  # a one-channel JPEG
        fp = fingerprint(np.asarray(grey)[..., None])
        assert hamming(fps[k].whole, fp.whole) <= NEAR_BITS
        r = correlations(np.stack([fps[k].thumbs, fp.thumbs]), np.array([0]), np.array([1]))[0]
        assert r >= SURE_CORRELATION, (k, r)
    greyed = [fingerprint(np.asarray(ImageOps.grayscale(picture(s)))[..., None]) for s in range(120)]
    mixed = [fps[k] if k % 2 else greyed[k] for k in range(120)]  # every other picture greyscale, all distinct
    whole, centre, mirror = (np.array([getattr(f, x) for f in mixed], dtype=np.uint64) for x in ("whole", "centre",
                                                                                               "mirror"))  # fmt: skip
    assert len(near_pairs(whole, centre, np.stack([f.thumbs for f in mixed]), mirror)[0]) == 0

    root = _folder(tmp_path / "photos", per_class=4, val_per_class=1)
    ImageOps.grayscale(Image.open(root / "train" / "b" / "02.jpg")).save(root / "val" / "b" / "grey.jpg", quality=90)
    (leak,) = check_folder(root, progress=False).of("leak")
    assert leak.paths == ("val/b/grey.jpg", "train/b/02.jpg") and leak.detail["match"] == "near"
    assert leak.detail["sure"]


def test_the_pair_search_is_the_brute_force_one(monkeypatch):
    """Blocks of rows against later rows (monkeypatched small: many blocks) give every pair within the threshold,
    each once, as the O(n^2) loop does."""
    from vitlab.data.check import perceptual

    rng = np.random.default_rng(1)
    whole = rng.integers(0, 2**63, 300, dtype=np.uint64)
    centre = rng.integers(0, 2**63, 300, dtype=np.uint64)
    mirror = rng.integers(0, 2**63, 300, dtype=np.uint64)
    for a, b, flips in ((3, 250, 5), (7, 8, 0), (100, 299, 12), (40, 41, 13)):  # planted pairs, one just too far
        whole[b] = whole[a] ^ np.uint64((1 << flips) - 1)
    centre[60] = whole[20] ^ np.uint64(0b111)  # a crop's whole hash near another's centre
    mirror[90] = whole[30] ^ np.uint64(0b11)  # a mirrored copy: its mirror hash near the other's whole hash
    monkeypatch.setattr(perceptual, "_BLOCK_ELEMENTS", 1000)
    i, j, d = hash_pairs(whole, centre, mirror, bits=NEAR_BITS)
    expect = {}
    for a in range(300):
        for b in range(a + 1, 300):
            dd = min(bin(int(whole[a]) ^ int(whole[b])).count("1"), bin(int(whole[a]) ^ int(centre[b])).count("1"),
                     bin(int(centre[a]) ^ int(whole[b])).count("1"),
                     bin(int(whole[a]) ^ int(mirror[b])).count("1"))  # fmt: skip
            if dd <= NEAR_BITS:
                expect[(a, b)] = dd
    assert dict(zip(zip(i.tolist(), j.tolist()), d.tolist())) == expect
    assert {(3, 250), (7, 8), (100, 299), (20, 60), (30, 90)} <= expect.keys() and (40, 41) not in expect


def test_phash_is_the_dct_hash():
    """The DCT matrix is the orthonormal DCT-II (scipy's), and the hash's bits are its 8x8 lowest frequencies
    above their median."""
    from scipy.fft import dctn

    g = np.random.default_rng(2).uniform(0, 255, (32, 32))
    d = _dct_matrix(32)
    np.testing.assert_allclose(d @ d.T, np.eye(32), atol=1e-12)
    low = dctn(g, norm="ortho")[:8, :8].ravel()
    bits = "".join("1" if v > np.median(low) else "0" for v in low)
    assert phash(g) == int(bits, 2)


def test_cli_json_report(faulty, capsys):
    assert main(["data", "check", str(faulty), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["vitlab_data_check"] == 1 and report["root"] == str(faulty.absolute())
    assert set(report["counts"]) >= {"images", *KINDS} and report["counts"]["leak"] == 7
    assert report["counts"]["leaked_eval"] == {"identical": 2, "near": 5}
    assert {s: v["role"] for s, v in report["splits"].items()} == {"train": "train", "val": "eval"}
    for f in report["findings"]:
        assert f["kind"] in KINDS and isinstance(f["paths"], list) and f["paths"]
        for p in f["paths"]:
            assert not p.startswith("/") and (faulty / p).exists(), p
    assert report["thresholds"]["near_bits"] == NEAR_BITS


def test_cli_summary_and_strict_data(faulty, capsys):
    assert main(["data", "check", str(faulty), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "leak: 7 evaluation image(s) are also in train/" in out and "  conflict: train/b/04.jpg (b)" in out
    assert main(["data", "check", str(faulty), "--no-progress", "--strict-data"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "vitlab data check: error: 6 evaluation image(s) also in train/ (sure copies)"
    )
    assert main(["data", "check", str(faulty / "nope")]) == 2
    assert main(["data", "check", str(faulty), "extra"]) == 2


def test_the_hashes_are_kept_for_the_next_check(tmp_path, monkeypatch):
    root = _folder(tmp_path / "photos", per_class=3, val_per_class=1)
    cache = tmp_path / "cache"
    first = check_folder(root, progress=False, cache_dir=cache)
    assert len(list(cache.glob("datacheck-*.hashes.json"))) == 1
    read = []
    real = records_mod._read
    monkeypatch.setattr(records_mod, "_read", lambda p, m: read.append(p) or real(p, m))
    again = check_folder(root, progress=False, cache_dir=cache)
    assert read == [] and again.report() == first.report()
    picture(999).save(root / "train" / "a" / "00.jpg", quality=92)  # a file changed: read again, alone
    check_folder(root, progress=False, cache_dir=cache)
    assert read == [str(root / "train" / "a" / "00.jpg")]


def test_cache_ls_counts_and_clear_deletes_the_kept_hashes_and_nothing_else(tmp_path, capsys):
    """The hashes files stayed in the cache folder for ever (an older version's too, which no check reads again):
    ``vitlab cache ls`` did not show them and ``clear`` did not delete them. Now both do, and a file of another
    content or a link under the same name pattern is never taken for one."""
    root = _folder(tmp_path / "photos", per_class=3, val_per_class=1)
    cache = tmp_path / "cache"
    check_folder(root, progress=False, cache_dir=cache)
    older = cache / "datacheck-0123456789abcdef0123.hashes.json"
    older.write_text('{"vitlab_data_check_hashes": 1, "files": {}}')  # an older vitlab's
    other = cache / "datacheck-aaaaaaaaaaaaaaaaaaaa.hashes.json"
    other.write_text("a user's file")
    link = cache / "datacheck-bbbbbbbbbbbbbbbbbbbb.hashes.json"
    link.symlink_to(older)
    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "no decode caches under" in out and "2 file(s) of hashes vitlab data check" in out
    assert main(["cache", "clear", "--cache-dir", str(cache)]) == 0
    assert ", and 2 file(s) of data check hashes" in capsys.readouterr().out
    assert sorted(p.name for p in cache.iterdir()) == sorted([other.name, link.name])
    assert other.read_text() == "a user's file" and link.is_symlink()


def test_a_held_out_split_leaks_what_lands_on_both_sides(tmp_path):
    root = tmp_path / "tree"
    for c in "ab":
        (root / c).mkdir(parents=True)
        for i in range(4):
            picture(ord(c) * 100 + i, (48, 36)).save(root / c / f"{i}.png")
    shutil.copy(root / "a" / "0.png", root / "a" / "0copy.png")
    check = check_folder(root, progress=False)
    assert check.held_out and check.of("leak") == [] and len(check.of("duplicate")) == 1
    files = sorted(str(p) for p in root.rglob("*.png"))
    ev = [str(root / "a" / "0copy.png"), str(root / "b" / "1.png")]
    split = check.with_roles(train=[f for f in files if f not in ev], evaluation=ev)
    assert [f.paths for f in split.of("leak")] == [("a/0copy.png", "a/0.png")]
    assert split.leaked() == {str(root / "a" / "0copy.png")}
    assert any(line.startswith("data check: leak: 1 evaluation image(s) are also in the training split (1 identical")
               for line in split.lines())  # fmt: skip


# -- a run on a folder -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def leaky(tmp_path_factory) -> Path:
    root = _folder(tmp_path_factory.mktemp("leaky") / "pets", per_class=8, val_per_class=4, size=(32, 24))
    for c in "ab":
        shutil.copy(root / "train" / c / "00.jpg", root / "val" / c / "leaked.jpg")
    reencoded(Image.open(root / "train" / "c" / "01.jpg"), 75).save(root / "val" / "c" / "resaved.png")
    return root


@pytest.mark.slow
def test_a_run_says_leak_first_and_keeps_the_report(leaky, tmp_path, capsys):
    from vitlab.train.persist.claim import written_by_vitlab
    from vitlab.train.persist.outputs import RUN_OUTPUTS

    out = tmp_path / "run"
    assert main(["train", "--data", str(leaky), "--out", str(out), *TRAIN]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("data check: leak: 3 evaluation image(s) are also in train/ (2 identical, 1 near ")
    assert lines[0].endswith(f"list in {out / 'data_check.json'}")
    report = json.loads((out / "data_check.json").read_text())
    assert report["counts"]["leak"] == 3 and "dedup_eval" not in report
    assert json.loads((out / "summary.json").read_text())["data"]["val"] == 15  # all evaluated
    assert "data_check.json" in RUN_OUTPUTS and written_by_vitlab(out / "data_check.json")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "data_check.json").write_text('{"mine": 1}')
    assert not written_by_vitlab(tmp_path / "theirs" / "data_check.json")  # --overwrite would stop on it
    assert main(["train", "--data", str(leaky), "--out", str(out), "--overwrite", *TRAIN]) == 0  # replaced


@pytest.mark.slow
def test_strict_data_stops_on_a_leak_in_one_line(leaky, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(leaky), "--out", str(out), "--strict-data", *TRAIN]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        "vitlab train: error: data check: 3 evaluation image(s) also in train/ (sure copies) (--strict-data)"
    )
    assert not (out / "last.pt").exists() and (out / "data_check.json").is_file()


@pytest.mark.slow
def test_dedup_eval_leaves_the_leaked_images_out(leaky, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(leaky), "--out", str(out), "--dedup-eval", *TRAIN]) == 0
    said = capsys.readouterr().out
    assert "data check: --dedup-eval: 3 evaluation image(s) also in training left out; 12 remain in val" in said
    assert json.loads((out / "summary.json").read_text())["data"]["val"] == 12
    assert json.loads((out / "data_check.json").read_text())["dedup_eval"] == {"left_out": 3, "remaining": 12}


@pytest.mark.slow
def test_the_report_shows_the_groups_as_thumbnails(leaky, tmp_path):
    from vitlab.inspect.report import render_html, training_artifacts

    run = tmp_path / "run"
    run.mkdir()
    report = check_folder(leaky, progress=False).report()
    report["findings"].append({"kind": "leak", "paths": ["../../etc/passwd", "/etc/passwd"], "match": "near"})
    (run / "data_check.json").write_text(json.dumps(report))
    (run / "summary.json").write_text(json.dumps({"epochs": 1}))
    _, sections = training_artifacts(run)
    (section,) = [s for s in sections if s.title == "Data check"]
    assert section.table["leak"] == 3 and len(section.gallery) == 4
    shown = {label: jpeg for _, row in section.gallery for label, jpeg in row}
    assert shown["val/a/leaked.jpg"][:2] == b"\xff\xd8" and shown["train/a/00.jpg"][:2] == b"\xff\xd8"
    assert shown["../../etc/passwd"] is None and shown["/etc/passwd"] is None  # never outside the folder
    assert render_html(sections, title="t").count("data:image/jpeg;base64,") == 6


def test_shards_are_said_not_checked(capsys):
    from vitlab.data.sources import DataSource
    from vitlab.distributed import Dist
    from vitlab.train.conf.train_config import TrainConfig
    from vitlab.train.engine.run_data import SHARDS_LINE, check_before

    said = []
    cfg = TrainConfig(data="shards/train-{000000..000003}.tar")
    assert check_before(cfg, DataSource.named(cfg.data), out=Path("x"), log=said.append, dist=Dist()) is None
    assert said == [SHARDS_LINE]


def test_a_folder_of_small_images_is_not_tiny(tmp_path):
    """``tiny`` is a thumbnail among larger pictures: a folder whose images are all 12 px (digits, icons, the
    project's own test folders) trains at its own size and has nothing tiny; one 12-px file among 96-px pictures is."""
    rng = np.random.default_rng(0)
    small = tmp_path / "small"
    for split, n in (("train", 4), ("val", 1)):
        for c in "abc":
            (small / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(small / split / c / f"{i}.png")
    assert _paths(check_folder(small), "tiny") == set()
    photos = _folder(tmp_path / "photos", per_class=4, val_per_class=1)
    Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(photos / "train" / "a" / "thumb.png")
    assert _paths(check_folder(photos), "tiny") == {("train/a/thumb.png",)}
