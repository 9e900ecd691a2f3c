"""Trackers never hold a run (issue 56): a tracker whose server does not answer is off for the run after a short
timeout, with one line (``--strict-log``: the run stops in one line); a stop signal while it connects ends the run
at once; what W&B refuses (no key, a dead server, a project name that is a path) is one line, never a traceback.

The servers are local sockets: one that accepts and never answers, one port where nothing listens. No test waits
longer than the tracker's own timeout, which the tests set short (``VITLAB_TRACKER_TIMEOUT``, ``timeout=``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import default_stop_signals, slow_cases
from vitlab.errors import ConfigError
from vitlab.track import TIMEOUT_ENV, make_trackers, tracker_timeout
from vitlab.track.backends import CsvTracker

SRC = str(Path(__file__).resolve().parent.parent / "src")


@pytest.fixture
def silent_server():
    """A local server that accepts connections and never answers: ``(socket, port)``."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    yield srv, srv.getsockname()[1]
    srv.close()


@pytest.fixture
def dead_port() -> int:
    """A local port where nothing listens (connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "WANDB_"))}
    return {**env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC, **extra}


def _wandb_home(tmp_path: Path) -> dict[str, str]:
    """W&B's own folders under ``tmp_path`` (never the user's)."""
    return {v: str(tmp_path / "wandb-home" / v.lower()) for v in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR",
                                                                   "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR")}  # fmt: skip


# -- the library: a silent server, a refused port -------------------------------------------------------------


@pytest.mark.parametrize("server", slow_cases(["silent", "refused"], {"silent"}))  # silent: its time-out
def test_an_mlflow_server_that_does_not_answer_turns_the_tracker_off(
    server, silent_server, dead_port, tmp_path, monkeypatch
):
    pytest.importorskip("mlflow")
    port = silent_server[1] if server == "silent" else dead_port
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:s3cret@127.0.0.1:{port}")
    lines: list[str] = []
    t = make_trackers(["csv", "mlflow"], out=tmp_path, config={"lr": 0.1}, strict=False, timeout=0.5, warn=lines.append)
    assert [type(x) for x in t.trackers] == [CsvTracker]  # the run goes on with the others
    t.log(1, {"loss": 1.0})
    t.close()
    assert (tmp_path / "scalars.csv").read_text() == "step,loss\n1,1.0\n"
    (line,) = lines
    assert line.startswith(f"warning: the tracker is off for this run: --log mlflow: http://127.0.0.1:{port}: ")
    assert "--strict-log" in line and "s3cret" not in line and "\n" not in line
    if server == "silent":  # (a refused port: MLflow retries until the timeout, or gives up first with its error)
        assert "no answer within 0.5 s" in line

    with pytest.raises(ConfigError) as e:  # strict: one line
        make_trackers(["mlflow"], out=tmp_path, config={}, timeout=0.5)
    assert str(e.value).startswith(f"--log mlflow: http://127.0.0.1:{port}: ") and "\n" not in str(e.value)
    if server == "silent":
        assert str(e.value) == (
            f"--log mlflow: http://127.0.0.1:{port}: no answer within 0.5 s ({TIMEOUT_ENV} to wait longer)"
        )


def test_a_stop_signal_ends_the_wait_for_a_silent_server(silent_server, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    srv, port = silent_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    srv.settimeout(60)
    asked: list[bool] = []

    def stop() -> str | None:  # "SIGTERM" from the moment the tracker is connected, as under torchrun
        if not asked:
            srv.accept()
            asked.append(True)
        return "SIGTERM"

    lines: list[str] = []
    t = make_trackers(["mlflow"], out=tmp_path, config={}, strict=False, timeout=600, stop=stop, warn=lines.append)
    assert t.trackers == [] and asked
    assert lines == [
        f"warning: the tracker is off for this run: --log mlflow: http://127.0.0.1:{port}: stopped waiting for it "
        "(SIGTERM); the run goes on without it (--strict-log stops instead)"
    ]


def test_the_timeout_is_read_from_the_environment_and_checked(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert tracker_timeout() == 15.0
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert tracker_timeout() == 2.5 and tracker_timeout(0.25) == 0.25
    for bad in ("soon", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError, match=f"{TIMEOUT_ENV}='{bad}': not a number of seconds"):
            tracker_timeout()


def test_a_local_tracker_that_fails_is_one_line(tmp_path):
    """A file named ``tensorboard`` or a folder named ``scalars.csv`` in the run folder: one line naming the logger
    (was a traceback), or the tracker off for the run."""
    pytest.importorskip("tensorboard")
    (tmp_path / "tensorboard").write_text("not a folder")
    with pytest.raises(ConfigError) as e:
        make_trackers(["tensorboard"], out=tmp_path, config={})
    assert str(e.value).startswith("--log tensorboard: ") and "\n" not in str(e.value)
    lines: list[str] = []
    t = make_trackers(["csv", "tensorboard"], out=tmp_path, config={}, strict=False, warn=lines.append)
    assert len(t.trackers) == 1 and len(lines) == 1 and "the tracker is off for this run: --log tensorboard" in lines[0]
    assert (tmp_path / "tensorboard").read_text() == "not a folder"

    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "scalars.csv").mkdir()  # a folder where the csv tracker's table goes
    lines.clear()
    t = make_trackers(["csv"], out=tmp_path / "folder", config={}, strict=False, warn=lines.append)
    t.log(1, {"loss": 1.0})
    t.close()
    assert len(lines) == 1 and lines[0].startswith("warning: the tracker is off for this run: --log csv: ")
    with pytest.raises(ConfigError, match="^--log csv: OutputError: .*scalars.csv: is a folder"):
        make_trackers(["csv"], out=tmp_path / "folder", config={}).log(1, {"loss": 1.0})
    assert not [p.name for p in (tmp_path / "folder").iterdir() if ".tmp" in p.name]  # no temporary file left


# -- W&B: no key, a dead server, a project name that is a path -----------------------------------------------------

WANDB_START = """
import sys
from vitlab.errors import ConfigError
from vitlab.track import make_trackers
strict = sys.argv[2] == "strict"
try:
    t = make_trackers(["csv", "wandb"], out=sys.argv[1], config={"lr": 0.1}, strict=strict, timeout=2)
except ConfigError as e:
    print("error:", e)
else:
    print("started:", ",".join(x.logger for x in t.trackers))
    t.close()
"""


def _wandb(tmp_path: Path, mode: str, **env: str) -> list[str]:
    pytest.importorskip("wandb")
    proc = subprocess.run(
        [sys.executable, "-c", WANDB_START, str(tmp_path / "run"), mode],
        capture_output=True, text=True, timeout=120, env=_env(**_wandb_home(tmp_path), **env),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout.splitlines()


@pytest.mark.slow
def test_wandb_without_a_key_is_one_line(tmp_path):
    out = _wandb(tmp_path, "strict", WANDB_MODE="online", NETRC=str(tmp_path / "no-netrc"))
    assert out == ["error: --log wandb: https://api.wandb.ai: UsageError: No API key configured. Use `wandb login` "
                   "to log in"]  # fmt: skip
    out = _wandb(tmp_path, "goes-on", WANDB_MODE="online", NETRC=str(tmp_path / "no-netrc"))
    assert out[0].startswith("warning: the tracker is off for this run: --log wandb: https://api.wandb.ai: UsageError")
    assert out[1:] == ["started: csv"]


@pytest.mark.slow
def test_wandb_with_a_dead_server_is_off_after_the_timeout(tmp_path, dead_port):
    out = _wandb(tmp_path, "goes-on", WANDB_BASE_URL=f"http://127.0.0.1:{dead_port}", WANDB_API_KEY="k" * 40)
    assert len(out) == 2 and out[1] == "started: csv"
    assert out[0].startswith(f"warning: the tracker is off for this run: --log wandb: http://127.0.0.1:{dead_port}: ")
    assert out[0].endswith("; the run goes on without it (--strict-log stops instead)")  # no answer within 2 s, or
    # W&B's own error when it gives up first


@pytest.mark.parametrize("project", ["../../etc", "/tmp/x", "a" * 129, ".hidden", "bad:name", ""])
def test_a_wandb_project_name_is_not_a_path(tmp_path, monkeypatch, project):
    pytest.importorskip("wandb")
    from vitlab.track import check_trackers

    monkeypatch.setenv("WANDB_PROJECT", project)
    if not project:  # empty: W&B's default project name, vitlab
        assert check_trackers(["wandb"]) == ["wandb"]
        return
    with pytest.raises(ConfigError, match="is not a project name") as e:
        check_trackers(["wandb"])
    assert str(e.value).startswith("--log wandb: WANDB_PROJECT ") and "\n" not in str(e.value)


# -- vitlab train ----------------------------------------------------------------------------------------------------


def _train(out: Path, *extra: str, env: dict[str, str], **kw) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vitlab", "train", "--out", str(out), "--epochs", "1", "--no-progress", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw)


@pytest.mark.slow
def test_train_goes_on_without_a_silent_tracker_or_stops_with_strict_log(tmp_path, silent_server):
    pytest.importorskip("mlflow")
    port = silent_server[1]
    env = _env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}", **{TIMEOUT_ENV: "1"})
    proc = _train(tmp_path / "run", "--log", "csv,mlflow", env=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert (
        f"warning: the tracker is off for this run: --log mlflow: http://127.0.0.1:{port}: no answer within 1 s" in out
    )
    assert "Traceback" not in err and (tmp_path / "run" / "scalars.csv").is_file()
    assert (tmp_path / "run" / "summary.json").is_file()

    proc = _train(tmp_path / "strict", "--log", "mlflow", "--strict-log", env=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert err.splitlines() == [
        f"vitlab train: error: --log mlflow: http://127.0.0.1:{port}: no answer within 1 s ({TIMEOUT_ENV} to wait "
        "longer)"
    ]
    assert not (tmp_path / "strict" / ".lock").exists()


@pytest.mark.slow
def test_sigterm_while_a_tracker_connects_ends_the_run_at_once(tmp_path, silent_server):
    """Before: SIGTERM was only noted (training had begun) while MLflow retried for minutes: the run neither
    started nor stopped."""
    pytest.importorskip("mlflow")
    srv, port = silent_server
    env = _env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}", **{TIMEOUT_ENV: "600"})
    proc = _train(tmp_path / "run", "--log", "mlflow", env=env, preexec_fn=default_stop_signals)
    try:
        srv.settimeout(300)
        conn, _ = srv.accept()  # the event: the run is connecting to the tracker's server
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        conn.close()
    finally:
        if proc.poll() is None:  # a hang: end it, the assertions below fail
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert err.splitlines()[-1] == "vitlab: stopped by SIGTERM before training began; nothing to save"
    assert "Traceback" not in err and not (tmp_path / "run" / ".lock").exists()


@pytest.mark.slow
def test_train_refuses_a_wandb_project_that_is_a_path_before_the_data(tmp_path):
    pytest.importorskip("wandb")
    env = _env(WANDB_PROJECT="../../etc", WANDB_MODE="offline", **_wandb_home(tmp_path))
    proc = _train(tmp_path / "run", "--log", "wandb", "--data", str(tmp_path / "missing"), env=env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert err.splitlines() == [
        "vitlab train: error: --log wandb: WANDB_PROJECT '../../etc' is not a project name (up to 128 letters, "
        "digits, '_', '-' and '.', not starting with '.'; a project name is not a path)"
    ]


def test_a_server_that_stops_answering_mid_run_turns_the_tracker_off(tmp_path, monkeypatch):
    """A tracker that started, whose server then stops answering: each call waits at most the timeout."""
    import threading

    from vitlab.track import backends

    release = threading.Event()

    class Hanging:
        logger = "mlflow"

        def log(self, step, scalars):
            release.wait()  # a server that never answers (until the test ends)

        def log_config(self, config):
            pass

        def close(self):
            pass

    monkeypatch.setattr(backends, "make", lambda name, out: Hanging())
    monkeypatch.setattr(backends, "server", lambda name: "http://tracking.example")
    lines: list[str] = []
    try:
        t = make_trackers(["mlflow"], out=tmp_path, config={}, strict=False, timeout=0.2, warn=lines.append)
        t.log(1, {"loss": 1.0})  # returns after the timeout: the tracker is off
        t.log(2, {"loss": 0.5})  # not called again
        t.close()
        strict = make_trackers(["mlflow"], out=tmp_path, config={}, timeout=0.2)
        with pytest.raises(ConfigError, match=r"^--log mlflow: http://tracking.example: no answer within 0.2 s"):
            strict.log(1, {"loss": 1.0})
    finally:
        release.set()
    assert t.trackers == [] and len(lines) == 1
    assert lines[0].startswith("warning: the tracker is off for this run: --log mlflow: http://tracking.example: no ")
