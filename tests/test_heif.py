"""HEIC/HEIF photos (an iPhone's default format): read through the one decoder where the ``heif`` extra
(``pillow-heif``) is installed, turned as the file says, in every path (a folder, predict, the data check, tar
shards); named with the extra that reads them where it is not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitlab.data.images.decode import HEIF_MISSING, decode_image, image_size, is_image_name, unread_format

pillow_heif = pytest.importorskip("pillow_heif")
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _halves(w: int = 96, h: int = 48) -> Image.Image:
    """Red on the left, blue on the right: a turn or a mirror shows in where the colours end up."""
    a = np.zeros((h, w, 3), np.uint8)
    a[:, : w // 2] = (220, 30, 30)
    a[:, w // 2 :] = (30, 30, 220)
    return Image.fromarray(a)


def _save_heic(im: Image.Image, path: Path, orientation: int = 1) -> Path:
    pillow_heif.register_heif_opener()
    exif = Image.Exif()
    exif[0x0112] = orientation
    im.save(path, format="HEIF", quality=95, exif=exif.tobytes())
    return path


def test_a_heic_photo_decodes_as_its_jpeg_does(tmp_path):
    """A portrait (EXIF orientation 6, as a phone stores it) is turned once, as the same picture saved as a JPEG
    with the same tag is: the same size from the header and from the pixels, the colours in the same places."""
    im = _halves()
    heic = _save_heic(im, tmp_path / "p.HEIC", orientation=6)
    exif = Image.Exif()
    exif[0x0112] = 6
    im.save(tmp_path / "p.jpg", quality=95, exif=exif.tobytes())
    want = decode_image(tmp_path / "p.jpg")
    got = decode_image(heic)
    assert got.shape == want.shape == (96, 48, 3) and image_size(heic) == image_size(tmp_path / "p.jpg") == (48, 96)
    assert np.abs(got.astype(int) - want.astype(int)).mean() < 6  # two lossy codecs of one picture
    assert is_image_name("IMG_0001.HEIC") and unread_format("IMG_0001.heic") is None


@pytest.mark.slow
def test_heic_photos_train_predict_and_are_checked(tmp_path, capsys):
    """A folder of HEIC photos is a data set like any other: the scan takes them, the data check hashes them, they
    pack into tar shards a run trains on (the shard reader takes a .heic member), and predict reads one."""
    from vitlab.cli import main
    from vitlab.data import load_data

    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 2)):
        for c in ("a", "b"):
            (tmp_path / "d" / split / c).mkdir(parents=True)
            for i in range(n):
                a = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
                _save_heic(Image.fromarray(a), tmp_path / "d" / split / c / f"{i}.heic")
    splits = load_data(str(tmp_path / "d"), cache_dir=tmp_path / "c", progress=False)
    assert (len(splits.train), len(splits.val)) == (12, 4)
    check = ["data", "check", str(tmp_path / "d"), "--json", "--no-progress", "--cache-dir", str(tmp_path / "c")]
    assert main(check) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["images"] == 16 and report["counts"]["unreadable"] == 0
    assert main(["data", "pack", str(tmp_path / "d"), "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    assert "12 samples" in capsys.readouterr().out
    run = tmp_path / "run"
    argv = ["train", "--data", str(tmp_path / "s"), "--out", str(run), "--epochs", "1", "--img-size", "16",
            "--patch-size", "8", "--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "4",
            "--cache-dir", str(tmp_path / "c"), "--no-progress", "--workers", "0"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "12 train / 4 val" in out.replace(" validation", " val") and "bad_files" not in out
    assert main(["predict", "--model", str(run), str(tmp_path / "d" / "val" / "a" / "0.heic"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["top"]


def test_without_the_extra_a_heic_is_named_with_what_reads_it(tmp_path):
    """Without pillow-heif (made unimportable in a child process): a HEIC in a class folder is left out with the
    extra that reads it, and decoding one (predict's path) says the same, never "cannot identify image file"."""
    heic = _save_heic(_halves(), tmp_path / "x.heic")
    code = f"""
        import json, sys
        sys.modules["pillow_heif"] = None
        from vitlab.data.images.decode import decode_image, image_size, is_image_name, unread_format
        try:
            decode_image({str(heic)!r})
            err = None
        except ValueError as e:
            err = str(e)
        print(json.dumps([is_image_name("x.heic"), unread_format("x.heic"), err, image_size({str(heic)!r})]))
    """
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    named, why, err, size = json.loads(done.stdout)
    assert (named, why, err, size) == (False, HEIF_MISSING, HEIF_MISSING, None)
    assert "pip install 'vitlab[heif]'" in HEIF_MISSING


@pytest.mark.parametrize("first", ["decode_encoded", "image_size", "decode_image"])
def test_the_first_heif_a_process_meets_registers_the_decoder_in_every_path(tmp_path, first):
    """A fresh process (a DataLoader worker, a shard reader) has no HEIF opener until the decoder meets its first
    HEIF file, whichever path meets it: encoded bytes of a shard's member (the first version read the member's head
    from where PIL's failed open had left the stream, and said "cannot identify image file"), a header, a file."""
    heic = _save_heic(_halves(), tmp_path / "x.heic", orientation=6)
    arg = f"Path({str(heic)!r}).read_bytes()" if first == "decode_encoded" else repr(str(heic))
    code = f"""
        import json
        from pathlib import Path
        from vitlab.data.images import decode
        out = decode.{first}({arg})
        print(json.dumps(list(out if first == "image_size" else out.shape)))
    """.replace("first ==", f"{first!r} ==")
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ([48, 96] if first == "image_size" else [96, 48, 3])


def test_the_heif_benchmark_decodes_both_formats(monkeypatch, capsys):
    """``benchmarks/bench_heif.py --smoke``: its rows (never its numbers)."""
    from benchscripts import load

    bench = load("bench_heif")
    monkeypatch.setattr("sys.argv", ["bench_heif.py", "--smoke"])
    bench.main()
    out = capsys.readouterr().out
    assert "| jpeg |" in out and "| heic |" in out and "6 photos" in out and "# load average at end" in out
