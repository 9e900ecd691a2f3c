"""What only the command line may say (issue 56): ``--overwrite`` acts only on a ``--out`` typed on this command
line and removes only what vitlab wrote there (git's rule for what it did not create); a ``pipe:`` in ``--data``
runs only when that ``--data`` and ``--allow-pipe`` are typed on this command line (fresh runs, config files and
resumes alike)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import vitlab
from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.models import VisionTransformer, ViTConfig

SMALL = ["--recipe", "small-data", "--batch-size", "16", "--warmup-epochs", "1", "--patch-size", "4", "--dim", "16",
         "--depth", "1", "--heads", "2", "--workers", "0", "--threads", "1", "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("overwrite") / "rgb")


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def users_folder(root: Path) -> Path:
    """A folder of the user's own, holding things named like a run's: ``model/``, ``wandb/``, ``mlruns/``,
    ``tensorboard/``, ``summary.json``."""
    root.mkdir(parents=True)
    for rel, text in (
        ("model/weights.bin", "mine"),
        ("model/config.json", '{"architectures": ["MyNet"]}'),
        ("wandb/settings", "mine"),
        ("mlruns/0/meta.yaml", "mine"),
        ("tensorboard/events.out.tfevents.1.host", "my own curves"),
        ("summary.json", '{"my": "summary"}'),
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_overwrite_never_clears_the_folder_a_config_file_names(data_dir, tmp_path, capsys):
    """With ``--overwrite`` and no ``--out`` typed, the folder a config file names was cleared."""
    mine = users_folder(tmp_path / "mine")
    before = snapshot(mine)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {data_dir}\nout: {mine}\nrecipe:\n  epochs: 1\n")
    assert main(["train", "--config", str(cfg), "--overwrite", *SMALL]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--overwrite: acts only on a --out typed on this command line" in err and f"--out {mine}" in err, err
    assert snapshot(mine) == before


def test_overwrite_stops_before_replacing_a_file_vitlab_did_not_write(data_dir, tmp_path, capsys):
    mine = users_folder(tmp_path / "mine")
    before = snapshot(mine)
    assert main(["train", "--data", str(data_dir), "--out", str(mine), "--epochs", "1", "--overwrite", *SMALL]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"--overwrite: {mine} holds summary.json, model/config.json, which vitlab did not write" in err, err
    assert snapshot(mine) == before


def _vitlab_run(out: Path, data_dir: Path) -> None:
    assert main(["train", "--data", str(data_dir), "--out", str(out), "--epochs", "1", "--log", "csv", *SMALL]) == 0


@pytest.mark.slow
def test_overwrite_removes_the_run_s_own_outputs_and_keeps_the_rest(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    _vitlab_run(out, data_dir)
    old_weights = (out / "model" / "model.safetensors").read_bytes()
    for rel, text in (
        ("model/README.md", "my notes on this model"),
        ("tensorboard/events.out.tfevents.1.host", "my own curves"),
        ("wandb/settings", "mine"),
        ("mlruns/0/meta.yaml", "mine"),
        ("notes.txt", "mine"),
    ):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    theirs = {rel: (out / rel).read_bytes() for rel in snapshot(out) if rel.split("/")[0] in ("wandb", "mlruns")}
    theirs |= {r: (out / r).read_bytes() for r in ("model/README.md", "tensorboard/events.out.tfevents.1.host")}
    capsys.readouterr()
    argv = ["train", "--data", str(data_dir), "--out", str(out), "--epochs", "1", "--seed", "1", "--overwrite"]
    assert main([*argv, *SMALL]) == 0
    log = capsys.readouterr().out
    assert "removed the previous run's summary.json, last.pt, metrics.jsonl, model, curves.png" in log, log
    assert "kept 2 entries vitlab did not write (model/README.md, tensorboard/events.out.tfevents.1.host)" in log
    assert "kept wandb/, mlruns/" in log
    for rel, data in theirs.items():
        assert (out / rel).read_bytes() == data, rel
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "scalars.csv").exists()  # vitlab's own table of the old run (no --log csv now)
    assert (out / "model" / "model.safetensors").read_bytes() != old_weights
    assert json.loads((out / "summary.json").read_text())["epochs"] == 1


def test_a_run_folder_given_as_data_is_refused_before_overwrite_removes_anything(finished_run, run_copy, tmp_path):
    """The library's ``fit`` tells what ``--data`` names once, before the run folder is claimed: a run folder given as
    the data (not a data set) is refused with ``overwrite`` before the previous run's outputs are removed. (Before:
    ``vitlab.train.fit`` removed them first, then refused the data; the command line checked the data earlier.)"""
    from vitlab.data import DataError
    from vitlab.errors import ConfigError
    from vitlab.train import TrainConfig, fit

    before = snapshot(run_copy)
    with pytest.raises(DataError, match="a run folder .vitlab train --out wrote it., not a data set"):
        fit(TrainConfig(data=str(finished_run), out=str(run_copy), progress=False), overwrite=True)
    assert snapshot(run_copy) == before
    data = tiny_folder(tmp_path / "photos", per_class=2, test_per_class=1)  # an --out inside the data: refused too
    with pytest.raises(ConfigError, match="inside the data folder"):
        fit(TrainConfig(data=str(data), out=str(data / "run"), progress=False))
    assert not (data / "run").exists()


def test_convert_overwrite_never_replaces_another_program_s_model(tmp_path, capsys):
    torch.manual_seed(0)
    cfg = ViTConfig(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=16, num_classes=3)
    vitlab.save(VisionTransformer(cfg), tmp_path / "m")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "vit"}')
    (hf / "model.safetensors").write_bytes(b"their weights")
    before = snapshot(hf)
    assert main(["convert", str(tmp_path / "m"), str(hf), "--overwrite"]) == 2
    assert "holds a config.json vitlab did not write" in one_line(capsys.readouterr().err)
    assert snapshot(hf) == before


def test_pack_overwrite_never_removes_a_manifest_vitlab_did_not_write(data_dir, tmp_path, capsys):
    out = tmp_path / "shards"
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "my dataset card"}')
    (out / "train-000000.tar").write_bytes(b"my tar")
    before = snapshot(out)
    assert main(["data", "pack", str(data_dir), str(out), "--no-progress", "--overwrite"]) == 2
    assert "manifest.json is not one vitlab wrote" in one_line(capsys.readouterr().err)
    assert snapshot(out) == before


# -- pipe: -------------------------------------------------------------------------------------------------------


def test_a_config_file_s_pipe_never_runs_even_with_allow_pipe(tmp_path, capsys):
    """``vitlab train --config FILE --allow-pipe`` ran a ``pipe:`` command only the file held."""
    ran = tmp_path / "ran"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"data": f"pipe:touch {ran}; cat /dev/null", "recipe": {"epochs": 1}}))
    argv = ["train", "--config", str(cfg), "--allow-pipe", "--out", str(tmp_path / "run"), *SMALL]
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert "pipe:" in err and "--allow-pipe" in err, err
    assert not ran.exists()


def test_one_rule_for_pipe_typed_data_with_allow_pipe():
    from vitlab.train.conf.options import pipe_trusted

    assert pipe_trusted(True, {"data", "allow_pipe"}) and pipe_trusted(True, {"--data", "--allow-pipe"})
    assert not pipe_trusted(True, {"allow_pipe"})  # --data from a config file, a default or a saved run
    assert not pipe_trusted(False, {"data"})
