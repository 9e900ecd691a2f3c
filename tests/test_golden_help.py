"""``vitlab train --help`` and ``vitlab finetune --help`` print exactly the saved text (tests/golden/, at 120
columns): the parser is generated from the option table, and a change to what users read must be intended (the
golden file is then updated with it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitlab.cli import main

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_help_is_the_golden_text(command, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out == (GOLDEN / f"{command}_help.txt").read_text()
