"""Trackers (vitlab.track): each backend's output read back with its own format's reader; nothing imported
until asked; a missing library is one line naming the extra."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time

import pytest

from vitlab.errors import ConfigError
from vitlab.track import BACKENDS, FanOut, Tracker, make_trackers
from vitlab.track.backends import CsvTracker, wandb_mode

CONFIG = {"lr": 0.001, "model": {"depth": 4, "name": "vit_ti16"}, "layers": [1, 2]}


def _log_three(tracker) -> None:
    tracker.log(0, {"train_loss": 2.0, "lr": 1e-4})
    tracker.log(10, {"train_loss": 1.5, "lr": 1e-3, "attn/entropy/layer1": 3.25})  # a scalar first seen later
    tracker.log(20, {"train_loss": 1.0})


# -- nothing imported unless asked ---------------------------------------------------------------------


def test_importing_vitlab_track_and_logging_csv_imports_no_backend_library(tmp_path):
    code = (
        "import sys; from vitlab.track import make_trackers; "
        f"t = make_trackers(['csv'], out={str(tmp_path)!r}, config={{}}); t.log(0, {{'a': 1.0}}); t.close(); "
        "print([m for m in ('tensorboard', 'torch.utils.tensorboard', 'wandb', 'mlflow') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("name", "module"), [("tensorboard", "tensorboard"), ("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_missing_library_is_one_line_naming_the_extra(tmp_path, monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ConfigError) as e:
        make_trackers([name], out=tmp_path, config={})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"--log {name}:") and f"pip install 'vitlab[{name}]'" in msg


def test_names_are_checked_split_and_deduplicated(tmp_path):
    with pytest.raises(ConfigError, match="unknown logger 'neptune'; choose from csv, tensorboard, wandb, mlflow"):
        make_trackers(["csv", "neptune"], out=tmp_path, config={})
    t = make_trackers(["csv,CSV", " csv "], out=tmp_path, config={})
    assert len(t.trackers) == 1 and isinstance(t.trackers[0], CsvTracker)
    t.close()
    none = make_trackers([], out=tmp_path / "none", config=CONFIG)
    none.log(0, {"a": 1.0})
    none.close()
    assert not (tmp_path / "none").exists()
    assert isinstance(none, Tracker) and isinstance(t.trackers[0], Tracker) and BACKENDS[0] == "csv"


def test_a_tracker_that_cannot_start_closes_those_started(tmp_path, monkeypatch):
    closed = []
    monkeypatch.setattr(CsvTracker, "close", lambda self: closed.append(self.path))
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match="wandb"):
        make_trackers(["csv", "wandb"], out=tmp_path, config={})
    assert closed == [tmp_path / "scalars.csv"]


def test_fan_out_closes_every_tracker_and_raises_the_first_failure():
    calls = []

    class Bad:
        def close(self):
            calls.append("bad")
            raise OSError("disk full")

    class Good:
        def close(self):
            calls.append("good")

    with pytest.raises(OSError, match="disk full"):
        FanOut([Bad(), Good()]).close()
    assert calls == ["bad", "good"]


# -- csv -----------------------------------------------------------------------------------------------


def _rows(path):
    with path.open(newline="") as f:
        return list(csv.reader(f))


def test_csv_one_header_stable_columns_padded_rows(tmp_path):
    t = make_trackers(["csv"], out=tmp_path, config=CONFIG)
    _log_three(t)
    t.close()
    rows = _rows(tmp_path / "scalars.csv")
    assert rows == [
        ["step", "train_loss", "lr", "attn/entropy/layer1"],
        ["0", "2.0", "0.0001", ""],
        ["10", "1.5", "0.001", "3.25"],
        ["20", "1.0", "", ""],
    ]
    assert json.loads((tmp_path / "scalars_config.json").read_text()) == CONFIG
    assert not list(tmp_path.glob(".scalars.csv.tmp*"))


def test_csv_appends_to_a_resumed_run_keeping_its_columns(tmp_path):
    t = CsvTracker(out=tmp_path)
    t.log(0, {"b": 1.0, "a": 2.0})
    t.close()
    t = CsvTracker(out=tmp_path)
    t.log(5, {"a": 3.0, "b": float("nan"), "c": 7})
    t.close()
    with (tmp_path / "scalars.csv").open(newline="") as f:
        got = list(csv.DictReader(f))
    assert [list(r) for r in got] == [["step", "b", "a", "c"]] * 2
    assert got[1] == {"step": "5", "b": "nan", "a": "3.0", "c": "7.0"}
    assert got[0]["c"] == ""


def test_csv_refuses_a_file_it_did_not_write(tmp_path):
    (tmp_path / "scalars.csv").write_text("name,score\nx,1\n")
    with pytest.raises(ConfigError, match="not a scalars table vitlab wrote"):
        CsvTracker(out=tmp_path)
    assert (tmp_path / "scalars.csv").read_text() == "name,score\nx,1\n"


# -- TensorBoard ---------------------------------------------------------------------------------------


def test_tensorboard_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = make_trackers(["tensorboard"], out=tmp_path, config=CONFIG)
    _log_three(t)
    t.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"train_loss", "lr", "attn/entropy/layer1"}
    assert [(e.step, e.value) for e in acc.Scalars("train_loss")] == [(0, 2.0), (10, 1.5), (20, 1.0)]
    assert [(e.step, e.value) for e in acc.Scalars("attn/entropy/layer1")] == [(10, 3.25)]
    assert [e.step for e in acc.Scalars("lr")] == [0, 10]
    (text,) = acc.Tensors("config/text_summary")
    assert '"depth": 4' in text.tensor_proto.string_val[0].decode()


# -- Weights & Biases ----------------------------------------------------------------------------------


def _wandb_records(path):
    """The protobuf records of a W&B ``.wandb`` file: a 7-byte header, then LevelDB-log blocks of 32 KiB
    holding chunks with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if length == 0 and kind == 0:  # block padding
            pos += left
            continue
        if pos + 7 + length > len(data):  # still being written
            break
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """No API key, no netrc, W&B's own folders inside tmp_path."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    return tmp_path


def test_wandb_mode_offline_without_a_key_and_as_told(wandb_env, monkeypatch):
    assert wandb_mode() == "offline"
    (wandb_env / "netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    monkeypatch.setenv("NETRC", str(wandb_env / "netrc"))
    assert wandb_mode() == "online"
    monkeypatch.setenv("NETRC", str(wandb_env / "no-netrc"))
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode() == "offline"


def test_wandb_offline_run_holds_the_history_and_config(wandb_env):
    pytest.importorskip("wandb")
    out = wandb_env / "run"
    t = make_trackers(["wandb"], out=out, config=CONFIG)
    assert t.trackers[0].mode == "offline"
    _log_three(t)
    t.close()
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    (data,) = run_dir.glob("run-*.wandb")
    # finish() hands the records to W&B's service process, which writes the file on its own time
    deadline = time.monotonic() + 120
    records = _wandb_records(data)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, "W&B's service did not write the run's exit record in 120 s"
        time.sleep(0.2)
        records = _wandb_records(data)
    history = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            history.append({k: v for k, v in items.items() if not k.startswith("_")} | {"step": r.history.step.num})
    assert history == [
        {"step": 0, "train_loss": 2.0, "lr": 1e-4},
        {"step": 10, "train_loss": 1.5, "lr": 1e-3, "attn/entropy/layer1": 3.25},
        {"step": 20, "train_loss": 1.0},
    ]
    config = {}
    for r in records:
        if r.WhichOneof("record_type") == "config":
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
    assert config["lr"] == 0.001 and config["model"] == {"depth": 4, "name": "vit_ti16"}


# -- MLflow --------------------------------------------------------------------------------------------


@pytest.fixture
def mlflow_env(monkeypatch):
    pytest.importorskip("mlflow")
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # unset for the tracker; restored after the test


def _mlflow_run(uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("vitlab").experiment_id])
    return client, run


def test_mlflow_local_file_store_reads_back(tmp_path, mlflow_env):
    config = {**CONFIG, "long": "x" * 7000}
    t = make_trackers(["mlflow"], out=tmp_path / "run", config=config)
    _log_three(t)
    t.log(30, {"odd name:1": 0.5})
    t.close()
    client, run = _mlflow_run((tmp_path / "run" / "mlruns").as_uri())
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(0, 2.0), (10, 1.5), (20, 1.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "attn/entropy/layer1")] == [
        (10, 3.25)
    ]
    assert run.data.metrics["odd name_1"] == 0.5
    params = run.data.params
    assert params["lr"] == "0.001" and params["model.depth"] == "4" and params["layers"] == "[1, 2]"
    assert len(params["long"]) == 6000 and params["long"].endswith("...")


def test_mlflow_honours_the_tracking_uri(tmp_path, mlflow_env, monkeypatch):
    uri = (tmp_path / "elsewhere").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    t = make_trackers(["mlflow"], out=tmp_path / "run", config={})
    t.log(1, {"a": 1.0})
    t.close()
    assert not (tmp_path / "run" / "mlruns").exists()
    _, run = _mlflow_run(uri)
    assert run.data.metrics == {"a": 1.0}


def test_mlflow_refusing_the_file_store_is_one_line(tmp_path, mlflow_env, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    with pytest.raises(ConfigError) as e:
        make_trackers(["mlflow"], out=tmp_path, config={})
    assert "\n" not in str(e.value) and "MLFLOW_TRACKING_URI" in str(e.value)
