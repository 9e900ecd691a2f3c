"""vitlab with its base dependencies only (pyproject's ``dependencies``), as ``pip install vitlab`` leaves it.

CI installs the test references and every optional extra, so a runtime import of one of them (``import timm`` at
the top of a module, ``huggingface_hub`` where a name is resolved) would pass every other test and break the
package for a user. Here a child process makes them unimportable, then imports every module of the package and
runs what a user without extras runs: train, export to vitlab's own int8, predict; an extra's feature is refused in
one line naming the extra."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# the test references and the optional extras of pyproject.toml (scipy stays: scikit-learn, a base dependency, needs it)
NOT_INSTALLED = (
    "timm",
    "transformers",
    "hypothesis",
    "huggingface_hub",
    "webdataset",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "tensorboard",
    "wandb",
    "mlflow",
    "peft",
    "pillow_heif",
)

BLOCK = f"""
import sys
for name in {NOT_INSTALLED!r}:  # None in sys.modules: `import` raises ImportError, importlib.util.find_spec says None
    sys.modules[name] = None
"""


def run_child(body: str, cwd: Path) -> dict:
    """Runs ``body`` after the blocker in a fresh interpreter; its last stdout line is a JSON result."""
    code = BLOCK + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_module_imports_without_the_references_and_extras(tmp_path):
    got = run_child(
        """
        import importlib, json, pkgutil, sys
        import vitlab
        failed = {}
        names = [m.name for m in pkgutil.walk_packages(vitlab.__path__, "vitlab.") if not m.name.endswith("__main__")]
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as e:
                failed[name] = f"{type(e).__name__}: {e}"
        print(json.dumps({"modules": len(names), "failed": failed}))
        """,
        tmp_path,
    )
    assert got["failed"] == {}
    assert got["modules"] > 150  # the walk found the package (197 modules when written)


@pytest.mark.slow
def test_train_export_and_predict_without_the_references_and_extras(tmp_path):
    got = run_child(
        """
        import contextlib, io, json
        from pathlib import Path
        from PIL import Image
        from vitlab.cli import main

        tiny = ["--dim", "16", "--depth", "1", "--heads", "2", "--epochs", "1", "--batch-size", "16"]
        status = {}
        status["train"] = main(["train", *tiny, "--threads", "1", "--workers", "0", "--no-progress", "--out", "run"])
        status["export"] = main(["export", "--model", "run", "--format", "torch", "--int8", "dynamic",
                                 "--no-timing", "--out", "int8"])
        Image.new("RGB", (8, 8), (255, 255, 255)).save("white.png")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status["predict"] = main(["predict", "--model", "int8", "white.png", "--json"])
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status["onnx"] = main(["export", "--model", "run", "--format", "onnx", "--out", "onnx"])
        print(json.dumps({"status": status, "predicted": out.getvalue(), "onnx": err.getvalue()}))
        """,
        tmp_path,
    )
    assert got["status"] == {"train": 0, "export": 0, "predict": 0, "onnx": 2}, got
    (served,) = json.loads(got["predicted"])
    assert served["image"] == "white.png" and len(served["top"]) == 5
    assert "pip install 'vitlab[onnx]'" in got["onnx"] and got["onnx"].count("\n") == 1
    assert (tmp_path / "int8" / "config.json").is_file() and not (tmp_path / "onnx").exists()
