"""Outputs are guarded and signals save: a locked run folder, no silent re-use of a finished run,
temporary names unique per writer, export / convert / save that refuse to clobber, and SIGTERM /
SIGHUP that save and stop like Ctrl-C (single process and torchrun)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vitlab
from conftest import default_stop_signals
from imagefolder import tiny_folder
from vitlab._fs import FolderLock, temp_path
from vitlab.checkpoints import vitlab_folder as native
from vitlab.cli import main
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.train.engine.signals import StoppedBeforeTraining, StopSignals
from vitlab.train.persist.state import load_state

EPOCHS = 10  # 3 steps per epoch
SRC = str(Path(vitlab.__file__).parents[1])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("outputs") / "rgb")


def train_args(data_dir, out, *, epochs=EPOCHS, extra=()):
    return [
        "train",
        *("--data", str(data_dir), "--out", str(out), "--cache-dir", str(out.parent / "cache")),
        *("--recipe", "small-data", "--epochs", str(epochs), "--batch-size", "16", "--warmup-epochs", "1"),
        *("--patch-size", "4", "--dim", "16", "--depth", "1", "--heads", "2"),
        *("--workers", "0", "--threads", "1", "--no-progress", *extra),
    ]


def tiny_model(seed: int = 0) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(
        ViTConfig(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=16, num_classes=3)
    )


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    return err


# -- the run folder's lock ---------------------------------------------------------------------


def test_a_second_run_into_a_locked_folder_is_refused(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    with FolderLock(out):  # another live writer (this process, through another open file)
        assert main(train_args(data_dir, out)) == 2
        err = one_line(capsys.readouterr().err)
        assert f"{out} is in use by pid {os.getpid()} on {socket.gethostname()} (lock {out / '.lock'})" in err, err
    assert not (out / ".lock").exists()  # released on exit
    # Released on errors too: a run that fails after taking the lock leaves none behind.
    assert main(train_args(tmp_path / "missing", out)) == 2
    capsys.readouterr()
    assert not (out / ".lock").exists()


@pytest.mark.slow
def test_a_stale_lock_of_a_dead_process_is_taken_over(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    pid = dead_pid()
    (out / ".lock").write_text(f"{pid} {socket.gethostname()}\n")  # left by a killed run
    assert main(train_args(data_dir, out, epochs=1)) == 0
    err = capsys.readouterr().err
    assert f"took over the lock left by pid {pid} on {socket.gethostname()}, which is no longer running" in err
    assert not (out / ".lock").exists()
    assert json.loads((out / "summary.json").read_text())["epochs"] == 1


# -- re-using a run folder ---------------------------------------------------------------------


@pytest.mark.slow
def test_reusing_a_run_folder_is_refused_and_overwrite_leaves_only_the_new_run(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()  # an empty folder is fine
    assert main(train_args(data_dir, out, epochs=2)) == 0
    (out / "model" / "extra-from-the-old-run.txt").write_text("old")
    before = {n: (out / n).read_bytes() for n in ("summary.json", "metrics.jsonl", "last.pt")}
    capsys.readouterr()

    assert main(train_args(data_dir, out, epochs=1)) == 2  # neither --resume nor --overwrite
    err = one_line(capsys.readouterr().err)
    assert "holds another run (summary.json, last.pt, metrics.jsonl, model); pass --resume to continue it" in err
    assert {n: (out / n).read_bytes() for n in before} == before  # nothing touched

    assert main(train_args(data_dir, out, extra=["--resume", "--overwrite"])) == 2
    assert "--overwrite and --resume exclude each other" in one_line(capsys.readouterr().err)
    finetune = ["finetune", "--init", str(out / "model"), *train_args(data_dir, out, epochs=1)[1:], "--overwrite"]
    assert main(finetune) == 2  # --overwrite would delete the model it starts from
    assert "is inside" in one_line(capsys.readouterr().err) and (out / "model").is_dir()

    assert main(train_args(data_dir, out, epochs=1, extra=["--overwrite", "--dim", "8"])) == 0
    log = capsys.readouterr().out
    assert "removed the previous run's summary.json, last.pt, metrics.jsonl, model" in log
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1]  # only the new run's
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["epochs"], summary["model"]["embed_dim"]) == (1, 8)
    # issue 56: --overwrite never removes what vitlab did not write: the file put in model/ is kept, and named
    assert "kept 1 entries vitlab did not write (model/extra-from-the-old-run.txt)" in log
    names = ["config.json", "extra-from-the-old-run.txt", "model.safetensors"]
    assert sorted(p.name for p in (out / "model").iterdir()) == names
    assert vitlab.load(out / "model").config.embed_dim == 8
    assert load_state(out / "last.pt")["step"] == 3


# -- temporary files ---------------------------------------------------------------------------


def test_two_writers_of_one_model_folder_do_not_collide(tmp_path, monkeypatch):
    """A second save runs entirely inside the first (the worst interleaving of two writers): with
    shared temporary names the first one's rename found its file gone ("cannot write the model")."""
    a, b, folder = tiny_model(0), tiny_model(1), tmp_path / "m"
    real, calls = native.save_file, []

    def save_file(state, filename, **kw):
        real(state, filename, **kw)
        calls.append(filename)
        if len(calls) == 1:  # writer A has written its weights; writer B now writes the whole folder
            vitlab.save(b, folder, overwrite=True)

    monkeypatch.setattr(native, "save_file", save_file)
    vitlab.save(a, folder)
    assert calls[0] != calls[1]  # each writer its own temporary file
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]  # none left
    got = vitlab.load(folder).state_dict()
    assert all(torch.equal(got[k], v) for k, v in a.state_dict().items())  # A renamed last: A's weights


def test_temporary_names_are_unique_and_stale_ones_are_removed(tmp_path):
    p = tmp_path / "last.pt"
    names = {temp_path(p).name for _ in range(50)}
    assert len(names) == 50 and all(n.startswith(f".last.pt.tmp{os.getpid()}-") for n in names)
    vitlab.save(tiny_model(), tmp_path / "m")
    stale = tmp_path / "m" / f".model.safetensors.tmp{dead_pid()}-0a1b2c3d"
    alive = tmp_path / "m" / f".config.json.tmp{os.getppid()}-0a1b2c3d"  # a live writer's: kept
    stale.write_bytes(b"half")
    alive.write_bytes(b"half")
    vitlab.save(tiny_model(), tmp_path / "m", overwrite=True)
    assert not stale.exists() and alive.exists()


# -- save, export and convert refuse to clobber ------------------------------------------------


def test_save_refuses_an_existing_model_unless_overwrite(tmp_path):
    vitlab.save(tiny_model(0), tmp_path / "m")
    with pytest.raises(vitlab.CheckpointError, match=r"m: already holds a model \(model.safetensors, config.json\)"):
        vitlab.save(tiny_model(1), tmp_path / "m")
    assert torch.equal(vitlab.load(tmp_path / "m").pos_embed, tiny_model(0).pos_embed)
    vitlab.save(tiny_model(1), tmp_path / "m", overwrite=True)
    assert torch.equal(vitlab.load(tmp_path / "m").pos_embed, tiny_model(1).pos_embed)
    (tmp_path / "file").write_text("x")
    with pytest.raises(vitlab.CheckpointError, match="is a file, not a folder"):
        vitlab.save(tiny_model(), tmp_path / "file", overwrite=True)


def test_export_refuses_an_existing_file_and_its_own_input(tmp_path, capsys):
    from vitlab.export import ExportError, export_model

    m = tmp_path / "m"
    vitlab.save(tiny_model(), m)
    weights = (m / "model.safetensors").read_bytes()
    for flags in ([], ["--overwrite"]):  # the model's own file: never, --overwrite or not
        argv = ["export", "--model", str(m), "--format", "torchscript", "--out", str(m / "model.safetensors")]
        assert main([*argv, *flags]) == 2
        assert "is the input model" in one_line(capsys.readouterr().err)
    assert (m / "model.safetensors").read_bytes() == weights

    dst = tmp_path / "vit.pt"
    dst.write_bytes(b"someone's file")
    argv = ["export", "--model", str(m), "--format", "torchscript", "--out", str(dst), "--no-check"]
    assert main(argv) == 2
    assert f"--out {dst}: already exists; pass --overwrite" in one_line(capsys.readouterr().err)
    assert dst.read_bytes() == b"someone's file"
    assert main([*argv, "--overwrite"]) == 0
    assert torch.jit.load(str(dst)) is not None
    with pytest.raises(ExportError, match="already exists"):
        export_model(tiny_model(), dst, format="torchscript", check=False)


def test_convert_refuses_an_existing_folder_and_its_own_input(tmp_path, capsys):
    m = tmp_path / "m"
    vitlab.save(tiny_model(), m)
    weights = (m / "model.safetensors").read_bytes()
    for src in (m, m / "model.safetensors"):  # the folder itself, or its file converted into its folder
        assert main(["convert", str(src), str(m), "--overwrite"]) == 2
        assert "would overwrite the input" in one_line(capsys.readouterr().err)
    assert (m / "model.safetensors").read_bytes() == weights
    assert main(["convert", str(m), str(tmp_path / "c")]) == 0
    assert main(["convert", str(m), str(tmp_path / "c")]) == 2
    assert "already holds a model (model.safetensors, config.json); pass --overwrite" in capsys.readouterr().err
    assert main(["convert", str(m), str(tmp_path / "c"), "--overwrite"]) == 0


# -- signals -----------------------------------------------------------------------------------

# After its first step the run waits for the test's signal (an event, not a clock: on a busy machine the test's
# own work may take longer than the whole run), then goes on, so the signal surely arrives while it trains; the
# deadline only keeps a broken test from hanging. --resume runs at full speed.
HELD = """
import sys, time
from vitlab.train.engine import trainer
on_step = trainer.Trainer._on_step
def held(self, res, loss):
    deadline = time.monotonic() + 300
    while not self.stop.requested and time.monotonic() < deadline:
        time.sleep(0.02)
    return on_step(self, res, loss)
trainer.Trainer._on_step = held
from vitlab.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env():
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}


def _wait_for_training(proc):
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("training "):
            return seen
    raise AssertionError("".join(seen))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_save_and_resume(data_dir, tmp_path, capsys, sig):
    out = tmp_path / "run"
    script = tmp_path / "slow.py"
    script.write_text(HELD)
    proc = subprocess.Popen(
        [sys.executable, str(script), *train_args(data_dir, out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        preexec_fn=default_stop_signals,
    )
    log = _wait_for_training(proc)
    if sig == signal.SIGTERM:  # meanwhile a second run into the same folder is refused
        assert main(train_args(data_dir, out)) == 2  # from this process: another pid
        assert f"in use by pid {proc.pid} on {socket.gethostname()}" in capsys.readouterr().err
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
    log = "".join(log) + rest
    assert proc.returncode == 128 + sig, log
    assert f"stopped by {sig.name} at epoch" in log and f"Continue with: vitlab train --out {out} --resume" in log
    state = load_state(out / "last.pt")
    assert 0 < state["step"] < 3 * EPOCHS
    assert json.loads((out / "summary.json").read_text())["signal"] == sig.name
    assert not (out / ".lock").exists()

    assert main(["train", "--out", str(out), "--resume", "--workers", "0", "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps"], summary["interrupted"]) == (3 * EPOCHS, False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, EPOCHS + 1))


@pytest.mark.usefixtures("default_signals")
def test_a_signal_before_training_ends_the_run_at_once():
    before = "stopped by SIGTERM before training began; nothing to save"
    with pytest.raises(StoppedBeforeTraining, match=before), StopSignals(single_process=True):
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    with StopSignals(single_process=False) as stop:  # under torchrun: never at once, repeats ignored
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGHUP)  # a repeat (torchrun forwards what the terminal also sent): ignored
        assert stop.name == "SIGHUP"


@pytest.mark.slow
def test_sigterm_to_torchrun_saves_on_every_rank_and_resumes(data_dir, tmp_path):
    out = tmp_path / "ddp"
    script = tmp_path / "slow.py"
    script.write_text(HELD)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.Popen(
        [*torchrun, str(script), *train_args(data_dir, out, epochs=4)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        preexec_fn=default_stop_signals,
    )
    log = _wait_for_training(proc)
    proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both workers
    rest, _ = proc.communicate(timeout=120)
    log = "".join(log) + rest
    assert "stopped by SIGTERM at epoch" in log and "Continue with" in log, log[-3000:]
    assert proc.returncode != 0  # torchrun itself re-raises the signal (SignalException), after the save
    state = load_state(out / "last.pt")
    assert 0 < state["step"] < 4 * 3  # 48 images, 16 per step (all ranks): stopped part-way
    assert len(state["torch_rng_ranks"]) == 2  # both ranks took part in the save
    done = subprocess.run(
        [*torchrun, "-m", "vitlab", "train", "--out", str(out), "--resume", "--workers", "0", "--no-progress"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=240,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["processes"], summary["interrupted"]) == (2, False)


def test_a_file_in_the_way_of_an_output_is_named(data_dir, tmp_path, capsys):
    """`--out notes/run` where notes is a file: the system says "Not a directory" or "File exists" (and `data pack`
    printed `[Errno 20] Not a directory: ...`); the one line names the file in the way."""
    notes = tmp_path / "notes"
    notes.write_text("mine")
    cfg = ViTConfig(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=16, num_classes=3)
    vitlab.save(VisionTransformer(cfg.replace(class_names=("class0", "class1", "class2"))), tmp_path / "m")
    commands = {
        "train": train_args(data_dir, notes / "run", epochs=1),
        "data": ["data", "pack", str(data_dir), "--out", str(notes / "shards")],
        "eval": ["eval", "--model", str(tmp_path / "m"), "--data", str(data_dir), "--out", str(notes / "e.json")],
    }
    for command, args in commands.items():
        assert main(args) == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith(f"vitlab {command}: error: {notes}/") and f"({notes} is a file, not a folder)" in line
    assert main(train_args(data_dir, notes, epochs=1)) == 2
    assert f"{notes}: cannot write the folder (a file of that name is there)" in one_line(capsys.readouterr().err)
    assert notes.read_text() == "mine"
