"""What a SIGKILL leaves in ``sharded/`` is swept by the next save, and nothing else is: a save killed between
making its temporary folder and writing its marker, a deletion killed half-way (its marker already gone), beside
folders of another run sharing ``sharded/`` and a user's. The kill is an exception raised at that moment
(``SystemExit``, which nothing in the save catches); the saves are real DCP saves of a one-process run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from vitlab.distributed import Dist
from vitlab.train.persist import dcp

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP without a process group


class _Killed(BaseException):
    """A SIGKILL at this moment: nothing in vitlab catches it."""


def _save(out: Path, step: int) -> str:
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    return dcp.write_sharded(out, net=net, optimizer=opt, step=step, d=Dist(), device=torch.device("cpu"))


def _others(root: Path) -> list[str]:
    """A user's folder, another run's temporary folder (its own tag and marker) and an unmarked folder named
    as vitlab names them (which may be anyone's): none is this run's."""
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("keep")
    other = root / f".step-00000003-0badf00d-{'f' * 16}.tmp"
    other.mkdir()
    (other / dcp.MARKER).write_text(f"vitlab sharded checkpoint of the run with token {'f' * 32}\n")
    (root / ".step-00000004-0badf00d.tmp").mkdir()
    (root / "step-00000004-0badf00d").mkdir()
    return sorted(["mine", other.name, ".step-00000004-0badf00d.tmp", "step-00000004-0badf00d"])


def test_a_save_killed_before_its_marker_is_written_is_swept_by_the_next(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    first = _save(out, 1)
    dcp.prune(out, keep=first)
    others = _others(out / dcp.SHARDED_DIR)

    real = Path.write_text

    def killed(self, *a, **k):
        if self.name == dcp.MARKER:
            raise _Killed
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", killed)
    with pytest.raises(_Killed):
        _save(out, 2)
    monkeypatch.undo()
    left = sorted(p.name for p in (out / dcp.SHARDED_DIR).iterdir())
    half = [n for n in left if n not in others and n != Path(first).name]
    assert len(half) == 1 and half[0].startswith(".step-00000002-") and half[0].endswith(".tmp"), left
    assert not list((out / dcp.SHARDED_DIR / half[0]).iterdir())  # made, not yet marked: only its name is ours

    last = _save(out, 3)
    dcp.prune(out, keep=last)
    assert sorted(p.name for p in (out / dcp.SHARDED_DIR).iterdir()) == sorted([*others, Path(last).name])
    assert (out / last / ".metadata").is_file()


def test_a_deletion_killed_after_the_marker_went_is_finished_by_the_next_save(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    old = _save(out, 1)
    others = _others(out / dcp.SHARDED_DIR)
    new = _save(out, 2)

    def killed(path, *a, **k):  # the worst order a filesystem may list a folder in: the marker first
        (Path(path) / dcp.MARKER).unlink()
        raise _Killed

    monkeypatch.setattr(dcp.shutil, "rmtree", killed)
    with pytest.raises(_Killed):
        dcp.prune(out, keep=new)
    monkeypatch.undo()
    left = sorted(p.name for p in (out / dcp.SHARDED_DIR).iterdir())
    assert Path(old).name not in left and len(left) == len(others) + 2, left  # renamed, half-deleted

    last = _save(out, 3)
    dcp.prune(out, keep=last)
    assert sorted(p.name for p in (out / dcp.SHARDED_DIR).iterdir()) == sorted([*others, Path(last).name])


def test_overwrite_clears_the_run_s_half_made_and_half_deleted_folders_only(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    _save(out, 1)
    root = out / dcp.SHARDED_DIR
    others = _others(root)
    tag = dcp.run_token(out)[:16]
    (root / f".step-00000009-01234567-{tag}.tmp").mkdir()
    (root / f".trash-89abcdef-{tag}").mkdir()
    (root / f".trash-89abcdef-{tag}" / "__0_0.distcp").write_bytes(b"x")
    assert sorted(dcp.clear(out)) == others
    assert sorted(p.name for p in root.iterdir()) == others
