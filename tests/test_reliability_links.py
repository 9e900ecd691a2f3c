"""Nothing written through a link (issue 56). A run, export or report folder may hold links (people link ``model/``
or a figure to a shared disk): every writer replaces a link named like its output (to a file, a folder, or nothing)
instead of writing through it, and a folder it writes into is made a real folder first; what the link pointed to is
never touched. A file or folder in the way, a full disk and a read-only folder are one line each, and leave no
partial file behind."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from conftest import slow_cases
from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.distributed import Dist
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.train.persist.state import load_state

# -- the victims: a file and a folder outside the output folder ------------------------------------------------


class Victims:
    """A file and a folder (holding files named like a model's, and a note) that links in an output folder point
    to; :meth:`assert_intact` checks that nothing in them changed, nothing was added and nothing removed."""

    def __init__(self, root: Path) -> None:
        self.root = root / "victims"
        self.folder = self.root / "shared"
        self.folder.mkdir(parents=True)
        self.file = self.root / "precious.txt"
        self.file.write_bytes(b"the user's own file\n")
        for name, text in (("model.safetensors", b"not a model"), ("config.json", b'{"mine": 1}\n')):
            (self.folder / name).write_bytes(text)
        (self.folder / "notes.txt").write_bytes(b"notes\n")
        self.before = self._snapshot()

    def _snapshot(self) -> dict[str, bytes]:
        return {
            p.relative_to(self.root).as_posix(): p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()
        }

    def assert_intact(self) -> None:
        assert self._snapshot() == self.before

    def copy(self, name: str, text: bytes) -> Path:
        """One more victim file holding ``text``."""
        p = self.root / name
        p.write_bytes(text)
        self.before = self._snapshot()
        return p


@pytest.fixture
def victims(tmp_path):
    return Victims(tmp_path)


def link(entry: Path, target: Path) -> Path:
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.symlink_to(target)
    return entry


def real_file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def real_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink()


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def tiny_model(**kw) -> VisionTransformer:
    torch.manual_seed(0)
    cfg = dict(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=16, num_classes=3)
    return VisionTransformer(ViTConfig(**{**cfg, **kw})).eval()


TARGETS = ("file", "folder", "nothing")


def target(victims: Victims, kind: str) -> Path:
    return {"file": victims.file, "folder": victims.folder, "nothing": victims.root / "missing"}[kind]


# -- the helper every writer goes through ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", TARGETS)
def test_replacing_replaces_a_link_and_own_folder_replaces_a_linked_folder(victims, tmp_path, kind):
    from vitlab._fs import append_text, atomic_write_text, own_folder

    out = tmp_path / "out"
    atomic_write_text(link(out / "a.json", target(victims, kind)), "{}\n")
    append_text(link(out / "log.jsonl", target(victims, kind)), "{}\n")
    own_folder(link(out / "sub", target(victims, kind)))
    victims.assert_intact()
    assert real_file(out / "a.json") and real_file(out / "log.jsonl") and real_dir(out / "sub")
    assert (out / "a.json").read_text() == "{}\n"
    if kind == "file":  # an appended log keeps what the link pointed to, in a file of its own
        assert (out / "log.jsonl").read_bytes() == b"the user's own file\n{}\n"


def test_a_folder_where_a_file_goes_and_a_file_where_a_folder_goes_are_one_line(tmp_path):
    from vitlab._fs import atomic_write_text, own_folder
    from vitlab.errors import OutputError

    (tmp_path / "summary.json").mkdir()
    with pytest.raises(OutputError, match="summary.json: is a folder, where vitlab writes a file"):
        atomic_write_text(tmp_path / "summary.json", "{}")
    (tmp_path / "tensorboard").write_text("mine")
    with pytest.raises(OutputError, match="tensorboard: is a file, where vitlab writes"):
        own_folder(tmp_path / "tensorboard")
    assert (tmp_path / "tensorboard").read_text() == "mine"


# -- each writer -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TARGETS)
def test_run_files_replace_links(victims, tmp_path, kind):
    """``last.pt``, ``summary.json``, ``config.yaml``, ``metrics.jsonl`` (appended and truncated)."""
    from vitlab.train.conf.train_config import TrainConfig
    from vitlab.train.persist.outputs import append_metrics, truncate_metrics, write_config, write_json
    from vitlab.train.persist.state import atomic_torch_save

    out = tmp_path / "run"
    atomic_torch_save({"step": 1}, link(out / "last.pt", target(victims, kind)))
    write_json({"top1": 1.0}, link(out / "summary.json", target(victims, kind)))
    link(out / "config.yaml", target(victims, kind))
    write_config(TrainConfig(), out)
    append_metrics({"epoch": 1}, link(out / "metrics.jsonl", target(victims, kind)))
    (out / "m2.jsonl").symlink_to(target(victims, kind))
    truncate_metrics(out / "m2.jsonl", last_epoch=0)
    victims.assert_intact()
    for name in ("last.pt", "summary.json", "config.yaml", "metrics.jsonl", "m2.jsonl"):
        assert real_file(out / name), name
    assert load_state(out / "last.pt") == {"step": 1}


@pytest.mark.parametrize("kind", TARGETS)
def test_the_run_s_model_folder_replaces_a_link(victims, tmp_path, kind):
    """``--resume`` with ``model -> DIR`` replaced the model.safetensors and config.json in DIR."""
    from vitlab.train.conf.train_config import TrainConfig
    from vitlab.train.persist.saver import CheckpointSaver

    out = tmp_path / "run"
    link(out / "model", target(victims, kind))
    lines: list[str] = []
    saver = CheckpointSaver(out, dist=Dist(), device=torch.device("cpu"), log=lines.append)
    cfg = TrainConfig()
    saver.save_model(tiny_model(), cfg=cfg, recipe=cfg.recipe, ev={"top1": 0.5, "top5": 1.0}, epoch=1)
    victims.assert_intact()
    assert real_dir(out / "model") and vitlab.load(out / "model").config.extra["epoch"] == 1
    assert any("was a link" in line for line in lines), lines


@pytest.mark.parametrize("kind", ["file", "nothing"])
def test_vitlab_save_replaces_links_named_like_its_files(victims, tmp_path, kind):
    out = tmp_path / "m"
    link(out / "model.safetensors", target(victims, kind))
    link(out / "config.json", target(victims, kind))
    vitlab.save(tiny_model(), out, overwrite=True)
    victims.assert_intact()
    assert real_file(out / "model.safetensors") and real_file(out / "config.json")
    vitlab.load(out)


@pytest.mark.parametrize("kind", TARGETS)
def test_figures_replace_links(victims, tmp_path, kind):
    """A run overwrote the file ``curves.png`` or ``confusion.png`` linked to."""
    from vitlab.train.persist.figures import draw_figures

    out = tmp_path / "run"
    for name in ("curves.png", "confusion.png", "health.png"):
        link(out / name, target(victims, kind))
    rows = [
        {"epoch": e, "train_loss": 1.0 / e, "eval_loss": 1.2 / e, "top1": 0.3 * e, "top5": 1.0, "lr": 1e-3,
         "attention": {"distance": [1.0, 2.0], "entropy": [0.5, 0.6]}}
        for e in (1, 2)
    ]  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = {"confusion": np.eye(3, dtype=int) * 4, "per_class": [1.0] * 3, "top1": 1.0, "top5": 1.0}
    draw_figures(out, ["a", "b", "c"], ev, title="test")
    victims.assert_intact()
    for name in ("curves.png", "confusion.png", "health.png"):
        assert real_file(out / name) and Image.open(out / name).format == "PNG", name


@pytest.mark.slow
def test_bad_files_list_replaces_a_link(victims, tmp_path, capsys):
    """``bad_files.txt``, written when the data has files that cannot be decoded."""
    data = tiny_folder(tmp_path / "data")
    (data / "train" / "class0" / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "run"
    link(out / "bad_files.txt", victims.file)
    argv = ["train", "--data", str(data), "--out", str(out), "--epochs", "1", *SMALL]
    assert main(argv) == 0
    victims.assert_intact()
    assert real_file(out / "bad_files.txt") and "broken.png" in (out / "bad_files.txt").read_text()


def test_the_data_check_report_replaces_a_link(victims, tmp_path):
    """``data_check.json``, the data check's report every run on a folder writes (issue 59)."""
    data = tiny_folder(tmp_path / "data")
    out = tmp_path / "run"
    link(out / "data_check.json", victims.file)
    assert main(["train", "--data", str(data), "--out", str(out), "--epochs", "1", *SMALL]) == 0
    victims.assert_intact()
    assert real_file(out / "data_check.json")
    assert json.loads((out / "data_check.json").read_text())["vitlab_data_check"] == 1


@pytest.mark.parametrize("kind", TARGETS)
def test_csv_tracker_replaces_links(victims, tmp_path, kind):
    """``--log csv`` overwrote the target of a linked ``scalars_config.json``; ``scalars.csv`` was appended to
    through its link."""
    from vitlab.track import make_trackers

    out = tmp_path / "run"
    csv_target = victims.copy("table.csv", b"step,loss\n1,0.5\n") if kind == "file" else target(victims, kind)
    link(out / "scalars.csv", csv_target)
    link(out / "scalars_config.json", target(victims, kind))
    t = make_trackers(["csv"], out=out, config={"lr": 0.1})
    t.log(2, {"loss": 0.25})
    t.log(3, {"loss": 0.125, "lr": 0.1})  # a new column: the table is written again
    t.close()
    victims.assert_intact()
    assert real_file(out / "scalars.csv") and real_file(out / "scalars_config.json")
    rows = (out / "scalars.csv").read_text().splitlines()
    assert rows[0] == "step,loss,lr" and rows[-1] == "3,0.125,0.1"
    assert json.loads((out / "scalars_config.json").read_text()) == {"lr": 0.1}


@pytest.mark.parametrize("kind", TARGETS)
def test_tensorboard_folder_replaces_a_link(victims, tmp_path, kind):
    pytest.importorskip("tensorboard")
    from vitlab.track import make_trackers

    out = tmp_path / "run"
    link(out / "tensorboard", target(victims, kind))
    t = make_trackers(["tensorboard"], out=out, config={"lr": 0.1})
    t.log(1, {"loss": 0.5})
    t.close()
    victims.assert_intact()
    assert real_dir(out / "tensorboard") and list((out / "tensorboard").glob("events.out.tfevents.*"))


def test_wandb_folder_replaces_a_link(victims, tmp_path, monkeypatch):
    """W&B writes its run under ``<out>/wandb``: a link there is replaced before it starts (W&B stubbed: it writes
    a file where the real one writes its run)."""
    wandb = pytest.importorskip("wandb")

    class Run:
        config = type("C", (), {"update": lambda *a, **k: None})()

        def log(self, *a, **k):
            pass

        def finish(self):
            pass

    def init(*, dir, **kw):
        (Path(dir) / "wandb" / "offline-run-x").mkdir(parents=True)
        (Path(dir) / "wandb" / "debug.log").write_text("written by W&B")
        return Run()

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setenv("WANDB_MODE", "offline")
    from vitlab.track.backends import WandbTracker

    out = tmp_path / "run"
    link(out / "wandb", victims.folder)
    WandbTracker(out=out).close()
    victims.assert_intact()
    assert real_dir(out / "wandb") and (out / "wandb" / "debug.log").is_file()


def test_mlflow_store_replaces_a_link(victims, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from vitlab.track import make_trackers

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "run"
    link(out / "mlruns", victims.folder)
    t = make_trackers(["mlflow"], out=out, config={"lr": 0.1})
    t.log(1, {"loss": 0.5})
    t.close()
    victims.assert_intact()
    assert real_dir(out / "mlruns") and any((out / "mlruns").iterdir())


@pytest.mark.parametrize("kind", ["file", "nothing"])  # (a link to a folder is a folder typed: the export goes in it)
def test_single_file_export_replaces_a_link(victims, tmp_path, kind):
    """``vitlab export --out x.pt --overwrite`` wrote into the file ``x.pt`` linked to."""
    from vitlab.export import export_model

    dst = link(tmp_path / "out" / "x.pt", target(victims, kind))
    res = export_model(tiny_model(), dst, format="torchscript", overwrite=True)
    victims.assert_intact()
    assert real_file(dst) and res.max_abs_diff is not None
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.slow
def test_onnx_export_command_replaces_a_link(victims, tmp_path, capsys):
    """The issue's case: ``vitlab export --out x.onnx --overwrite`` with ``x.onnx`` a link to a file."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    m = tmp_path / "m"
    vitlab.save(tiny_model(), m)
    dst = link(tmp_path / "x.onnx", victims.file)
    assert main(["export", "--model", str(m), "--out", str(dst), "--overwrite"]) == 0
    victims.assert_intact()
    assert real_file(dst) and dst.read_bytes()[:2] != b"th"


def test_export_folder_replaces_links(victims, tmp_path, capsys):
    """An export folder's model file, ``config.json`` and report: each a link, replaced, never written through."""
    m = tmp_path / "m"
    vitlab.save(tiny_model(), m)
    out = tmp_path / "deploy"
    argv = ["export", "--model", str(m), "--format", "torch", "--no-timing", "--out", str(out)]
    assert main(argv) == 0
    report = victims.copy("report.json", (out / "export_report.json").read_bytes())
    config = victims.copy("config.json", (out / "config.json").read_bytes())
    for name, to in (("export_report.json", report), ("config.json", config), ("model.safetensors", victims.file)):
        (out / name).unlink()
        link(out / name, to)
    assert main([*argv, "--overwrite"]) == 0
    victims.assert_intact()
    for name in ("export_report.json", "config.json", "model.safetensors"):
        assert real_file(out / name), name
    assert main(["predict", "--model", str(out), str(_png(tmp_path))]) == 0


def _png(tmp_path: Path) -> Path:
    p = tmp_path / "img.png"
    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(p)
    return p


@pytest.mark.parametrize("command", ["export", "inspect"])
def test_a_default_output_folder_in_the_model_s_folder_replaces_a_link(victims, tmp_path, capsys, command):
    """``vitlab export`` and ``vitlab inspect`` without ``--out`` write a folder inside the model's folder: a link
    there is replaced by a real folder, never written into (a folder typed with ``--out`` is the user's, followed)."""
    m = tmp_path / "m"
    vitlab.save(tiny_model(), m)
    name = "export-torch" if command == "export" else "inspect"
    link(m / name, victims.folder)
    if command == "export":
        argv = ["export", "--model", str(m), "--format", "torch", "--no-timing"]
    else:
        argv = ["inspect", "--model", str(m), "--image", str(_png(tmp_path)), "--device", "cpu"]
    assert main(argv) == 0
    victims.assert_intact()
    assert real_dir(m / name) and any((m / name).iterdir())


def test_npz_replaces_a_link(victims, tmp_path):
    from vitlab.checkpoints.npz_write import write_npz

    dst = link(tmp_path / "out.npz", victims.file)
    write_npz(tiny_model(), dst, overwrite=True)
    victims.assert_intact()
    assert real_file(dst) and vitlab.load(dst).config.embed_dim == 8


def test_inspect_report_replaces_links(victims, tmp_path):
    from vitlab.inspect.report import inspect_model

    out = tmp_path / "inspect"
    for name in ("report.html", "inspect.json", "attention_distance.png"):
        link(out / name, victims.file)
    images = np.random.default_rng(0).integers(0, 255, (2, 8, 8, 3), dtype=np.uint8)
    res = inspect_model(tiny_model(), images, out, progress=False)
    victims.assert_intact()
    for name in ("report.html", "inspect.json", "attention_distance.png"):
        assert real_file(out / name), (name, res["files"])


def test_eval_json_replaces_a_link(victims, tmp_path, capsys):
    m = tmp_path / "m"
    vitlab.save(tiny_model(img_size=8, num_classes=10), m)
    link(m / "eval.json", victims.file)
    assert main(["eval", "--model", str(m), "--data", "digits", "--device", "cpu"]) == 0
    victims.assert_intact()
    assert real_file(m / "eval.json") and "top1" in json.loads((m / "eval.json").read_text())


def test_the_run_folder_lock_replaces_a_link(victims, tmp_path):
    from vitlab._fs import FolderLock

    out = tmp_path / "run"
    link(out / ".lock", victims.file)
    with FolderLock(out, log=lambda m: None):
        assert real_file(out / ".lock")
    victims.assert_intact()


def test_data_pack_replaces_links(victims, tmp_path, capsys):
    src = tiny_folder(tmp_path / "src")
    out = tmp_path / "shards"
    assert main(["data", "pack", str(src), str(out), "--no-progress"]) == 0
    manifest = victims.copy("manifest.json", (out / "manifest.json").read_bytes())
    (out / "manifest.json").unlink()
    link(out / "manifest.json", manifest)
    (out / "train-000000.tar").unlink()
    link(out / "train-000000.tar", victims.file)
    assert main(["data", "pack", str(src), str(out), "--no-progress", "--overwrite"]) == 0
    victims.assert_intact()
    assert real_file(out / "manifest.json") and real_file(out / "train-000000.tar")


# -- a whole run resumed in a folder full of links ---------------------------------------------------------------

SMALL = ["--recipe", "small-data", "--batch-size", "16", "--warmup-epochs", "1", "--patch-size", "4", "--dim", "16",
         "--depth", "1", "--heads", "2", "--workers", "0", "--threads", "1", "--no-progress"]  # fmt: skip


@pytest.mark.slow
def test_resume_in_a_run_folder_of_links_writes_through_none(victims, tmp_path, capsys):
    data = tiny_folder(tmp_path / "data")
    out = tmp_path / "run"
    argv = ["train", "--data", str(data), "--out", str(out), "--epochs", "2", "--log", "csv", *SMALL]
    assert main([*argv, "--stop-after", "3"]) == 0
    for name in ("curves.png", "confusion.png", "summary.json", "scalars_config.json", "config.yaml"):
        (out / name).unlink()
        link(out / name, victims.file)
    rows = victims.copy("metrics.jsonl", (out / "metrics.jsonl").read_bytes())
    (out / "metrics.jsonl").unlink()
    link(out / "metrics.jsonl", rows)
    for f in (out / "model").iterdir():
        (victims.folder / f.name).write_bytes(f.read_bytes())  # the shared folder holds the user's own model
    victims.before = victims._snapshot()
    shutil.rmtree(out / "model")
    link(out / "model", victims.folder)
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--no-progress", "--workers", "0"]) == 0
    victims.assert_intact()
    for name in ("curves.png", "confusion.png", "summary.json", "scalars_config.json", "metrics.jsonl"):
        assert real_file(out / name), name
    assert real_dir(out / "model") and vitlab.load(out / "model").config.extra["epoch"] == 2
    assert [json.loads(r)["epoch"] for r in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


# -- things in the way, full and read-only disks: one line ----------------------------------------------------


@pytest.mark.parametrize(
    ("logger", "name", "make"), [("tensorboard", "tensorboard", "file"), ("csv", "scalars.csv", "dir")]
)
@pytest.mark.parametrize("strict", slow_cases([True, False], {False}))  # without --strict-log: a whole run
def test_a_file_or_folder_in_a_tracker_s_way_is_one_line(tmp_path, capsys, logger, name, make, strict):
    """What is in the tracker's way is never written over: ``--strict-log`` stops in one line naming it; without it
    the run goes on with the tracker off and one warning naming it (a tracker never stops a run,
    ``docs/reliability.md``)."""
    if logger == "tensorboard":
        pytest.importorskip("tensorboard")
    data = tiny_folder(tmp_path / "data")
    out = tmp_path / "run"
    out.mkdir()
    (out / name).write_text("mine") if make == "file" else (out / name).mkdir()
    argv = ["train", "--data", str(data), "--out", str(out), "--epochs", "1", "--log", logger, *SMALL]
    if strict:
        assert main([*argv, "--strict-log"]) == 2
        err = one_line(capsys.readouterr().err)
        assert f"{out / name}: is a" in err, err
    else:
        assert main(argv) == 0
        said = [line for line in capsys.readouterr().out.splitlines() if "the tracker is off for this run" in line]
        assert len(said) == 1 and f"{out / name}: is a" in said[0], said
        assert (out / "summary.json").is_file()
    assert (out / name).read_text() == "mine" if make == "file" else (out / name).is_dir()


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if ".tmp" in p.name or p.name.startswith(".vitlab"))


def test_a_full_disk_under_train_out_is_one_line(tmp_path, capsys, monkeypatch):
    data = tiny_folder(tmp_path / "data")
    out = tmp_path / "run"
    real = Path.write_text

    def full(self, *a, **k):  # the run folder's disk: the first bytes land, then it is full
        if out not in Path(self).parents:
            return real(self, *a, **k)
        real(self, "partial")
        _enospc()

    monkeypatch.setattr(Path, "write_text", full)
    assert main(["train", "--data", str(data), "--out", str(out), "--epochs", "1", *SMALL]) == 2
    err = one_line(capsys.readouterr().err)
    assert "No space left on device" in err and str(out) in err, err
    assert _leftovers(out) == [] if out.exists() else True


def test_a_full_disk_under_a_single_file_export_leaves_no_truncated_file(tmp_path, capsys, monkeypatch):
    m = tmp_path / "m"
    vitlab.save(tiny_model(), m)
    dst = tmp_path / "out" / "x.pt"

    def full(self, path, *a, **k):  # half a file, then the disk is full
        Path(path).write_bytes(b"PK\x03\x04 half")
        _enospc()

    monkeypatch.setattr(torch.jit.ScriptModule, "save", full)
    assert main(["export", "--model", str(m), "--format", "torchscript", "--out", str(dst)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "No space left on device" in err and str(dst) in err, err
    assert not dst.exists() and _leftovers(dst.parent) == []


def test_a_full_disk_under_an_export_folder_is_one_line(tmp_path, capsys, monkeypatch):
    import safetensors.torch

    m = tmp_path / "m"
    vitlab.save(tiny_model(), m)
    out = tmp_path / "deploy"

    def full(state, path, *a, **k):
        Path(path).write_bytes(b"half")
        _enospc()

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    assert main(["export", "--model", str(m), "--format", "torch", "--no-timing", "--out", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "No space left on device" in err, err
    assert not out.exists()  # made by the export, removed with what it held


def _read_only(folder: Path, how: str, monkeypatch) -> None:
    """Make ``folder`` read-only: by its mode (skipped for a user who writes anyway: root), or by a file system
    that answers every write under it with EROFS (what a read-only mount says)."""
    folder.mkdir(parents=True, exist_ok=True)
    if how == "simulated":
        import builtins
        import io

        def under(p) -> bool:
            try:
                return folder == Path(os.fsdecode(p)) or folder in Path(os.path.abspath(os.fsdecode(p))).parents
            except (TypeError, ValueError):
                return False

        def refuse(p):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(p))

        real_mkdir, real_os_open, real_open = os.mkdir, os.open, builtins.open

        def mkdir(p, *a, **k):
            return refuse(p) if under(p) else real_mkdir(p, *a, **k)

        def os_open(p, flags, *a, **k):
            writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            return refuse(p) if writes and under(p) else real_os_open(p, flags, *a, **k)

        def open_(p, mode="r", *a, **k):
            writes = any(c in mode for c in "wax+")
            return refuse(p) if writes and not isinstance(p, int) and under(p) else real_open(p, mode, *a, **k)

        monkeypatch.setattr(os, "mkdir", mkdir)
        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(builtins, "open", open_)
        monkeypatch.setattr(io, "open", open_)
        return
    folder.chmod(0o555)
    try:
        (folder / ".probe").write_text("x")
    except OSError:
        return
    (folder / ".probe").unlink()
    folder.chmod(0o755)
    pytest.skip("this user writes into read-only folders (root)")


@pytest.mark.parametrize("how", ["mode", "simulated"])
@pytest.mark.parametrize("command", ["train", "export-file", "export-folder"])
def test_a_read_only_output_folder_is_one_line(tmp_path, capsys, monkeypatch, command, how):
    ro = tmp_path / "ro"
    data = tiny_folder(tmp_path / "data") if command == "train" else None
    m = tmp_path / "m"
    vitlab.save(tiny_model(), m)
    _read_only(ro, how, monkeypatch)
    try:
        if command == "train":
            argv = ["train", "--data", str(data), "--out", str(ro / "run"), "--epochs", "1", *SMALL]
        else:
            dst = ro / ("x.pt" if command == "export-file" else "deploy")
            argv = ["export", "--model", str(m), "--format", "torchscript", "--out", str(dst)]
            argv += ["--no-timing"] if command == "export-folder" else []
        assert main(argv) == 2
        err = one_line(capsys.readouterr().err)
        assert "Permission denied" in err or "Read-only" in err, err
        monkeypatch.undo()
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


# -- figures that say what they are --------------------------------------------------------------------------


def _drawn(monkeypatch) -> list:
    """The figures saved from now on."""
    from matplotlib.figure import Figure

    figs, real = [], Figure.savefig

    def record(self, *a, **k):
        figs.append(self)
        return real(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", record)
    return figs


def test_curves_plot_the_evaluation_loss_beside_the_training_loss(tmp_path, monkeypatch):
    from vitlab.train.persist.figures import plot_curves

    figs = _drawn(monkeypatch)
    rows = [{"epoch": e, "train_loss": 2.0 / e, "eval_loss": 2.5 / e, "top1": 0.2 * e, "top5": 1.0, "lr": 1e-3}
            for e in (1, 2, 3)]  # fmt: skip
    plot_curves(rows, tmp_path / "curves.png", num_classes=3)
    lines = figs[-1].axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == ["train", "eval"]
    assert list(lines[1].get_ydata()) == [r["eval_loss"] for r in rows]
    rows[1]["eval_loss"] = None  # a row without one: left out of its curve, not drawn as 0
    plot_curves(rows, tmp_path / "curves.png", num_classes=3)
    assert list(figs[-1].axes[0].get_lines()[1].get_xdata()) == [1, 3]


@pytest.mark.parametrize("classes", [2, 3, 10, 40])
def test_the_confusion_title_fits_inside_the_figure(tmp_path, monkeypatch, classes):
    """The title was cut at the right (and the left) for a few classes and a long description of the weights."""
    from vitlab.train.persist.figures import plot_confusion

    figs = _drawn(monkeypatch)
    cm = np.eye(classes, dtype=int) * 5
    where = "val (1,234 images, +/-1.2), model/ = epoch 12 of 30"
    plot_confusion(cm, [f"class{i}" for i in range(classes)], tmp_path / "c.png", where=where)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = figs[-1]
    box = fig.axes[0].title.get_window_extent(FigureCanvasAgg(fig).get_renderer())  # (pyplot closed it)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, (box, fig.bbox)
    assert " ".join(fig.axes[0].get_title().split()) == f"confusion on {where} (accuracy 100.0%)"
