"""ImageFolder scans that cannot lie: link loops, FIFOs, non-UTF-8 names, strips, over-budget resizes, one class."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitlab.cli import main
from vitlab.data import DataError, load_data
from vitlab.data.images.decode import decode_image

SRC = str(Path(__file__).resolve().parents[1] / "src")
TINY = ["--patch-size", "4", "--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "4", "--recipe", "digits"]


def _classes(root: Path, names=("a", "b"), *, n: int = 6, size: int = 16) -> Path:
    """``root/<name>/NN.png``, every image different, so a copy of one is recognisable by its pixels."""
    rng = np.random.default_rng(0)
    for c in names:
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(root / c / f"{i:02d}.png")
    return root


def _in_subprocess(code: str, *, timeout: float = 30) -> str:
    """Run ``code`` in a fresh interpreter, killed after ``timeout`` s: the scans tried here used to hang."""
    env = {**os.environ, "PYTHONPATH": SRC}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _rows(split) -> list[bytes]:
    return [np.asarray(split.images[i]).tobytes() for i in range(len(split))]


def test_a_link_loop_is_followed_once_and_reported(tmp_path):
    root = _classes(tmp_path / "ds")
    os.symlink(".", root / "a" / "loop")  # counted the class 41 times
    os.symlink("00.png", root / "b" / "again.png")  # the same real file, reached twice
    s = load_data(str(root), val_split=0.25, cache_dir=tmp_path / "c", progress=False)
    assert len(s.train) + len(s.val) == 12
    train, val = _rows(s.train), _rows(s.val)
    assert len(set(train + val)) == 12 and not set(train) & set(val)  # no file in both splits
    why = dict(s.skipped)
    assert len(why) == 2
    assert "link loop" in why[str(root / "a" / "loop")] and str(root / "a") in why[str(root / "a" / "loop")]
    assert why[str(root / "b" / "again.png")] == f"the same file as {root / 'b' / '00.png'}; counted once"


def test_a_file_in_train_and_val_is_left_out_of_val(tmp_path):
    root = tmp_path / "ds"
    _classes(root / "train")
    _classes(root / "val", n=2)
    os.link(root / "train" / "a" / "03.png", root / "val" / "a" / "copy.png")  # a hard link: one real file
    s = load_data(str(root), cache_dir=tmp_path / "c", progress=False)
    assert (len(s.train), len(s.val)) == (12, 4)
    assert dict(s.skipped) == {
        str(root / "val" / "a" / "copy.png"): f"the same file as {root}/train/a/03.png; counted once"
    }


def test_two_loops_are_fast(tmp_path):
    root = _classes(tmp_path / "ds")
    os.symlink(".", root / "a" / "loop1")
    os.symlink("..", root / "b" / "up")  # back to the root, from which a/ and b/ are reached again
    os.symlink(".", root / "b" / "loop2")
    out = _in_subprocess(
        f"""
        from vitlab.data import load_data
        s = load_data({str(root)!r}, val_split=0.25, cache_dir={str(tmp_path / "c")!r}, progress=False)
        print(len(s.train) + len(s.val), len(s.skipped))
        """
    )
    assert out.split() == ["12", "3"]


def test_a_fifo_named_like_an_image_is_reported_never_opened(tmp_path):
    root = _classes(tmp_path / "ds")
    os.mkfifo(root / "a" / "x.png")  # opening it would wait for a writer forever
    os.symlink("/dev/zero", root / "b" / "zero.png")  # a device: reading it never ends
    out = _in_subprocess(
        f"""
        import json
        from vitlab.data import load_data
        from vitlab.data.images.decode import decode_image
        s = load_data({str(root)!r}, val_split=0.25, cache_dir={str(tmp_path / "c")!r}, progress=False)
        try:
            decode_image({str(root / "a" / "x.png")!r})
        except ValueError as e:
            print(json.dumps([len(s.train) + len(s.val), dict(s.skipped), str(e)]))
        """
    )
    n, skipped, err = json.loads(out)
    assert n == 12
    assert skipped == {
        str(root / "a" / "x.png"): "not a regular file (a FIFO); not opened",
        str(root / "b" / "zero.png"): "not a regular file (a character device); not opened",
    }
    assert err == "not a regular file (a FIFO); not opened"


def test_a_non_utf8_file_name_is_decoded_and_reported_readably(tmp_path):
    root = _classes(tmp_path / "ds")
    good = os.fsencode(root / "a") + b"/caf\xe9.png"  # Latin-1, not UTF-8
    bad = os.fsencode(root / "b") + b"/\xff.png"
    try:
        Image.new("RGB", (16, 16), (1, 2, 3)).save(good, "PNG")
        with open(bad, "wb") as f:
            f.write(b"not an image")
    except OSError as e:  # e.g. a file system that refuses names that are not UTF-8
        pytest.skip(f"this file system refuses a non-UTF-8 name: {e}")
    assert decode_image(good)[0, 0].tolist() == [1, 2, 3]  # a bytes path
    assert decode_image(os.fsdecode(good))[0, 0].tolist() == [1, 2, 3]  # a str path holding surrogates
    s = load_data(str(root), val_split=0.25, cache_dir=tmp_path / "c", progress=False)
    assert len(s.train) + len(s.val) == 13
    [(path, why)] = s.skipped
    assert path == f"{root}/b/\\xff.png" and "UnidentifiedImageError" in why and "\\xff.png" in why
    (tmp_path / "bad_files.txt").write_text(f"{path}\t{why}\n")  # what `vitlab train` writes: no UnicodeEncodeError


@pytest.mark.slow
def test_strips_are_skipped_and_never_set_the_size(tmp_path, capsys):
    root = _classes(tmp_path / "ds")
    for c in ("a", "b"):
        for i in range(7):  # more strips than pictures: the most common size was 1x700, a 700x700 input
            Image.new("RGB", (1, 700), (9, 9, 9)).save(root / c / f"thin{i}.png")
    out = tmp_path / "run"
    argv = ["train", "--data", str(root), "--val-split", "0.25", "--cache-dir", str(tmp_path / "c"), *TINY]
    argv += ["--memory-budget", "16M", "--stop-after", "1", "--workers", "0", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "skipped 14 file(s)" in said and "16x16 px, patch 4" in said  # not 700x700: 30,625 tokens
    bad = (out / "bad_files.txt").read_text().splitlines()
    assert len(bad) == 14 and all("1x700: one side is over 10 times the other" in line for line in bad)


def test_typical_side_is_the_median_shorter_side_without_strips():
    from vitlab.data.images.decode import typical_side

    assert typical_side({(16, 16): 3, (40, 24): 2, (1, 700): 10, (4000, 3000): 1}) == 16
    assert typical_side({(32, 48): 2, (48, 32): 2}) == 32  # no upscaling of the typical image


def test_an_image_whose_resize_exceeds_the_budget_is_skipped(tmp_path):
    root = _classes(tmp_path / "ds", n=3)
    Image.new("RGB", (40, 400), (9, 9, 9)).save(root / "a" / "tall.png")  # 10:1, allowed; 32x320x3 once resized
    s = load_data(str(root), val_split=0.34, size=32, cache_dir=tmp_path / "c", progress=False, buffer_bytes=32_000)
    assert len(s.train) + len(s.val) == 6
    [(path, why)] = s.skipped
    assert path == str(root / "a" / "tall.png")
    assert why == (
        "ValueError: 40x400 would take 30,720 bytes as 32x320 RGB, over the limit of 16,000 "
        "(half the memory budget, --memory-budget)"
    )


@pytest.mark.slow
def test_one_class_is_refused_unless_allowed(tmp_path, capsys):
    root = _classes(tmp_path / "ds", names=("cats",), n=8)
    common = ["--data", str(root), "--val-split", "0.25", "--cache-dir", str(tmp_path / "c"), *TINY]
    common += ["--stop-after", "1", "--workers", "0", "--no-progress"]
    assert main(["train", *common, "--out", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{root}: only one class ('cats') found; a classifier needs at least two" in err
    assert "--allow-single-class" in err
    assert main(["train", *common, "--allow-single-class", "--out", str(tmp_path / "r2")]) == 0
    assert "only one class ('cats'); top-1 is 100% by construction" in capsys.readouterr().out
    with pytest.raises(DataError, match="only one class"):
        load_data(str(root), val_split=0.34, cache_dir=tmp_path / "c", progress=False, min_classes=2)


def test_a_panorama_within_the_strip_rule_is_stored_whole_at_its_aspect_ratio(tmp_path):
    """A training run stores photos at their own aspect ratio: a 10:1 panorama is kept whole (shrunk to the
    stored shorter side, not cut to its centre square); one just over 10:1 is still a strip, skipped."""
    import functools

    from vitlab.data import PackedImages
    from vitlab.train import TrainConfig, get_recipe
    from vitlab.train.sizing.side import folder_storage

    root = _classes(tmp_path / "ds", n=3, size=200)
    Image.new("RGB", (2000, 200), (9, 9, 9)).save(root / "a" / "pano.png")
    Image.new("RGB", (2020, 200), (9, 9, 9)).save(root / "b" / "strip.png")
    cfg = TrainConfig(recipe=get_recipe("auto"), data=str(root), out="x", img_size=64)
    s = load_data(str(root), val_split=0.25, storage=functools.partial(folder_storage, cfg), cache_dir=tmp_path / "c")
    assert isinstance(s.train.images.base, PackedImages) and s.train.images.base is s.val.images.base
    shapes = sorted(s.train.images.base[i].shape for i in range(len(s.train) + len(s.val)))
    assert shapes == [(73, 73, 3)] * 6 + [(73, 730, 3)]  # shorter side floor(64 / 0.875), aspect ratio kept
    [(path, why)] = s.skipped
    assert path.endswith("strip.png") and "one side is over 10 times the other" in why


def test_a_labels_file_or_a_flat_folder_is_named_in_the_refusal(tmp_path, capsys):
    """A Kaggle-style folder (``train.csv`` of file and label beside ``train_images/``) was refused as "only one
    class ('train_images')", its images as "no class folders", and ``--data train.csv`` as "not an existing folder":
    nothing said where the labels go. Each refusal now says what it saw and where docs/training.md shows the way."""
    kag = _classes(tmp_path / "kag", names=("train_images",), n=3)
    (kag / "train.csv").write_text("image_id,label\n00.png,cat\n01.png,dog\n02.png,cat\n")
    common = ["--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "r"), "--no-progress"]
    assert main(["train", "--data", str(kag), *common]) == 2
    err = capsys.readouterr().err
    assert "only one class ('train_images')" in err and "train.csv is not read" in err and "Labels in a file" in err
    assert err.count("\n") == 1
    assert main(["train", "--data", str(kag / "train_images"), *common]) == 2
    err = capsys.readouterr().err
    assert "no class folders" in err and "3 image file(s) lie in it directly" in err and "train.csv" not in err
    for argv in (["train", "--data", str(kag / "train.csv"), *common], ["data", "check", str(kag / "train.csv")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "A labels file is not read" in err and "Labels in a file" in err and err.count("\n") == 1
    assert main(["train", "--data", str(kag / "train_images" / "00.png"), *common]) == 2
    err = capsys.readouterr().err  # a file that is no labels file: said to be a file, no labels hint
    assert "00.png': a file; --data is 'digits'" in err and "A labels file" not in err
    assert not (tmp_path / "r").exists()
    assert main(["data", "check", str(kag), "--no-progress", "--cache-dir", str(tmp_path / "c")]) == 0
    head = capsys.readouterr().out.splitlines()[0]  # was "3 image file(s) in 1 classes, splits ."
    assert head == f"{kag}: 3 image file(s) in 1 class, one class tree (no train/ and val/)"
    _classes(tmp_path / "plain", names=("only",), n=2)  # nothing else at its top: no hint
    with pytest.raises(DataError) as e:
        load_data(str(tmp_path / "plain"), cache_dir=tmp_path / "c", progress=False, min_classes=2)
    assert str(e.value).endswith("to train on it anyway)")


def test_a_class_folder_whose_files_are_all_links_is_not_called_empty(tmp_path):
    """Class folders made by hard links inside the folder of the originals (docs/training.md, "Labels in a file"):
    each file is counted once, under the folder scanned first, so the originals' folder came out empty and the
    refusal said "class folder(s) without image files: train_images" of a folder of 6 images."""
    root = _classes(tmp_path / "kag", names=("train_images",), n=6)
    for i in range(6):
        dest = root / "photos" / f"c{i % 2}" / f"{i:02d}.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(root / "train_images" / f"{i:02d}.png", dest)
    with pytest.raises(DataError) as e:
        load_data(str(root), cache_dir=tmp_path / "c", progress=False, min_classes=2)
    msg = str(e.value)
    assert "class folder train_images: each of its 6 image file(s) is the same file as one under another" in msg
    assert "without image files" not in msg and f"{root}/train_images/00.png = {root}/photos/c0/00.png" in msg
