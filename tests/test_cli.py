"""The command line: version, help, models table, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import vitlab
from vitlab.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"vitlab {vitlab.__version__}"


def test_version_has_one_source(tmp_path) -> None:
    """The package, the build metadata and saved checkpoints all read ``vitlab._version``."""
    from pathlib import Path

    from vitlab._version import __version__
    from vitlab.models import VisionTransformer, ViTConfig

    assert vitlab.__version__ == __version__
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()  # no tomllib on Python 3.10
    assert 'version = { attr = "vitlab._version.__version__" }' in pyproject
    m = VisionTransformer(ViTConfig(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2, mlp_dim=8))
    vitlab.save(m, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["vitlab_version"] == __version__


@pytest.mark.slow
def test_models_table_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    b16 = rows["vit_b16"]
    assert (b16["layers"], b16["width"], b16["mlp"], b16["heads"], b16["params"]) == (12, 768, 3072, 12, 86_567_656)
    assert b16["gflops"] == pytest.approx(35.1, abs=0.1)


@pytest.mark.slow
def test_models_table_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "vit_h14" in out and "632,045,800" in out


def test_every_command_has_help_with_an_example() -> None:
    from vitlab.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert {"models", "convert"} <= set(sub.choices)
    for name, p in sub.choices.items():
        assert "example" in (p.description or "") + (p.epilog or ""), f"`vitlab {name} --help` has no example"


def test_every_option_of_every_command_says_what_it_does() -> None:
    """An option listed in --help without a line of help leaves a user guessing its unit and default."""
    import argparse

    from vitlab.cli import build_parser

    def bare(parser: argparse.ArgumentParser, name: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    found += bare(sub, f"{name} {sub_name}".strip())
            elif action.option_strings and action.help != argparse.SUPPRESS and not (action.help or "").strip():
                found.append(f"vitlab {name} {action.option_strings[-1]}")
        return found

    assert bare(build_parser(), "") == []


@pytest.mark.slow
def test_bad_input_is_one_line_without_traceback() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "vitlab", "convert", "/no/such/file.npz", "/tmp/out"], capture_output=True, text=True
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vitlab convert: error:")
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_before_or_after_the_command(where: str, capsys) -> None:
    """``vitlab eval --model x --debug`` was ``unrecognized arguments: --debug``, under ``train`` with ``did you mean
    --time-budget?``: the flag is the top level's, and users put it after the command as well."""
    from vitlab.errors import UnknownModelError

    args = ["eval", "--model", "no_such_model"]
    with pytest.raises(UnknownModelError):
        main(["--debug", *args] if where == "before" else [*args, "--debug"])
    assert main(args) == 2
    assert capsys.readouterr().err.startswith("vitlab eval: error: --model 'no_such_model'")


@pytest.mark.slow
def test_models_lists_timm_names_and_public_checkpoints_and_filters(capsys: pytest.CaptureFixture[str]) -> None:
    """As ``timm.list_models(pattern, pretrained=...)``: the names vitlab takes, filtered by a shell-style pattern."""
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "deit_small_patch16_224" in out and "augreg_in21k_ft_in1k/vit_b16" in out  # timm's and public names
    assert main(["models", "*s16*"]) == 0
    names = [ln.split()[0] for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert "vit_s16" in names and "augreg_in21k/vit_s16" in names and "vit_b16" not in names
    assert main(["models", "--pretrained", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert by_name["vit_b16"]["pretrained"] == "augreg2_in21k_ft_in1k/vit_b16" and "vit_ti8" not in by_name
    assert by_name["deit_tiny_patch16_224"]["pretrained"] == "timm/deit_tiny_patch16_224.fb_in1k"
    assert by_name["google/vit_b16"]["repo"] == "google/vit-base-patch16-224"
    assert {r["kind"] for r in rows} == {"architecture", "timm", "checkpoint"}
    assert main(["models", "no_such_*"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitlab models: error: no model name matches 'no_such_*'") and err.count("\n") == 1
