"""The data check: what is wrong with a folder of images before a model trains on it (``vitlab data check DIR``, and
the first lines of every ``vitlab train`` / ``finetune`` on a folder).

One pass reads each file once (:mod:`.records`: content hash, size, perceptual fingerprint), the near copies are
found among the fingerprints (:mod:`.perceptual`), and the findings follow (:mod:`.findings`): files that cannot be
used, tiny pictures, strips, copies within a class, the same picture under two classes, evaluation pictures also in
training, and classes far smaller than the others.

    check = check_folder(Path("photos"))      # train/ + val/ (or test/), or one class tree
    check.report()                            # {"findings": [{"kind": ..., "paths": [...], ...}], "counts": ...}
    check.lines(where="runs/x/data_check.json")

The folder is read as ``vitlab train --data`` reads it (:func:`~vitlab.data.images.scan.scan_classes`, the split
folders of :func:`~vitlab.data.sources.eval_split_dir`); paths in the report are relative to it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..._text import readable
from ..images.decode import MAX_ASPECT
from ..images.scan import scan_classes
from ..sources import EVAL_DIRS
from .findings import (
    EXTREME_ASPECT,
    FEW_IMAGES,
    KINDS,
    MIN_CLASS_SHARE,
    TINY_SIDE,
    Finding,
    copy_findings,
    file_findings,
    groups,
    imbalance_findings,
)
from .perceptual import MIN_CORRELATION, NEAR_BITS, SURE_CORRELATION, near_pairs
from .records import FileRecord, Fingerprints, read_files

__all__ = ["KINDS", "REPORT_NAME", "DataCheck", "Finding", "check_folder"]

REPORT_NAME = "data_check.json"
"""The report a run writes in its folder (the same document as ``vitlab data check DIR --json``)."""
REPORT_VERSION = 1
_SHOWN = 3  # paths quoted in one line


def _rel(path: str, root: Path) -> str:
    return readable(os.path.relpath(path, root)).replace(os.sep, "/")


@dataclass(kw_only=True)
class DataCheck:
    """What one check of a folder found. ``records`` are its image files, ``roles[i]`` what record ``i`` is in the
    run (``train``, ``eval`` or None); ``folders`` maps each split to its folder relative to ``root`` (``""``: the
    folder is one class tree); ``held_out``: its evaluation split is held out of that tree by the run (which
    images, :meth:`with_roles` says once the run has split it)."""

    root: Path
    records: list[FileRecord]
    class_names: list[str]
    folders: dict[str, str]
    roles: list[str | None]
    group: np.ndarray
    sure_group: np.ndarray | None = None
    """The groups of identical files and sure near copies alone (:data:`~.perceptual.SURE_CORRELATION`; None: the
    same as ``group``): what ``--strict-data`` stops on."""
    walk_problems: list[tuple[str, str]]
    findings: list[Finding]
    linked: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """``{path: (record, class)}``: the walk's second paths (links) to a file it took, in the same split: the record
    of the path reached first and the class the second is filed under (:func:`_linked`)."""
    held_out: bool = False
    near: int = 0
    """Pairs of near copies found (byte-identical ones aside)."""

    # -- after the run's split ---------------------------------------------------------------------------------

    def with_roles(self, *, train: Collection[str], evaluation: Collection[str]) -> DataCheck:
        """The check of a class tree whose evaluation split the run held out: ``train`` and ``evaluation`` are the
        files (as the folder walk names them) on each side; a record on neither (left out) has no role. Its leaks
        are then the evaluation images with a copy in training."""
        tr, ev = set(train), set(evaluation)
        roles = ["eval" if r.path in ev else "train" if r.path in tr else None for r in self.records]
        return dataclasses.replace(self, roles=roles, findings=_findings(self, roles))

    def leaked(self) -> set[str]:
        """The evaluation files (as the folder walk names them) with a copy in training: what ``--dedup-eval``
        leaves out of the evaluation."""
        trained = {int(g) for g, role in zip(self.group, self.roles) if role == "train"}
        return {
            r.path
            for r, g, role in zip(self.records, self.group, self.roles)
            if role == "eval" and int(g) in trained and r.error is None
        }

    def of(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    # -- what it says --------------------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """The JSON report (``data_check.json``, ``vitlab data check --json``): the folder, its splits, the
        thresholds, the counts per kind and the findings, each ``{"kind", "paths", ...}`` with paths relative to the
        folder."""
        splits: dict[str, Any] = {}
        for split, folder in self.folders.items():
            rs = [(r, role) for r, role in zip(self.records, self.roles) if r.split == split]
            roles = sorted({role for _, role in rs if role is not None})
            splits[split] = {
                "folder": folder or ".",
                "role": "train+eval (held out)" if self.held_out and len(roles) > 1 else "/".join(roles) or "train",
                "images": len(rs),
                "readable": sum(r.error is None for r, _ in rs),
            }
        counts: dict[str, Any] = {"images": len(self.records), "near_pairs": self.near}
        counts.update({k: len(self.of(k)) for k in KINDS})
        leaks = self.of("leak")
        counts["leaked_eval"] = {m: sum(f.detail["match"] == m for f in leaks) for m in ("identical", "near")}
        counts["sure"] = {k: sum(f.detail["sure"] for f in self.of(k)) for k in ("duplicate", "conflict", "leak")}
        return {
            "vitlab_data_check": REPORT_VERSION,
            "root": os.path.abspath(self.root),
            "classes": list(self.class_names),
            "splits": splits,
            "held_out": self.held_out,
            "thresholds": {
                "tiny_side": TINY_SIDE,
                "extreme_aspect": EXTREME_ASPECT,
                "left_out_aspect": MAX_ASPECT,
                "near_bits": NEAR_BITS,
                "min_correlation": MIN_CORRELATION,
                "sure_correlation": SURE_CORRELATION,
                "min_class_share": MIN_CLASS_SHARE,
                "few_images": FEW_IMAGES,
            },
            "counts": counts,
            "findings": [f.record() for f in self.findings],
        }

    def _train_folder(self) -> str:
        trains = [self.folders[s] for s in self.folders if any(
            r.split == s and role == "train" for r, role in zip(self.records, self.roles))]  # fmt: skip
        if self.held_out or not trains:
            return "the training split"
        return ", ".join(f"{t}/" if t else "the folder" for t in trains)

    def lines(self, *, where: str | None = None, dedup: bool = False) -> list[str]:
        """One line per kind found, ``data check: <kind>: ...`` (the kind as the report names it), or one line saying
        none was; ``where``: the report's path, named at the end of each line; ``dedup``: the leaked evaluation
        images are left out (``--dedup-eval``)."""
        out: list[tuple[str, str]] = []
        if f := self.of("unreadable"):
            first = f[0].detail["reason"]
            out.append(("unreadable", f"{len(f):,} file(s) cannot be used (e.g. {f[0].paths[0]}: {first}): a run "
                        "leaves them out"))  # fmt: skip
        if f := self.of("tiny"):
            w, h = min((x.detail["size"] for x in f), key=lambda s: s[0] * s[1])
            out.append(("tiny", f"{len(f):,} image(s) under {TINY_SIDE} px a side (the smallest {w}x{h}): they "
                        "train as blurred enlargements of a few pixels"))  # fmt: skip
        if f := self.of("extreme_aspect"):
            left = sum(x.detail["left_out"] for x in f)
            note = f" ({left:,} over {MAX_ASPECT}x, which a run leaves out)" if left else ""
            out.append(("extreme_aspect", f"{len(f):,} strip-shaped image(s), one side over {EXTREME_ASPECT:g}x the "
                        f"other: a centre crop keeps a sliver of the picture{note}"))  # fmt: skip
        if f := self.of("duplicate"):
            extra = sum(len(x.paths) - 1 for x in f)
            same = sum(x.detail["match"] == "identical" for x in f)
            out.append(("duplicate", f"{extra:,} image(s) repeat another of their class ({len(f):,} group(s): "
                        f"{same:,} identical, {len(f) - same:,} near copies{_unsure(f)}): each copy weighs double in "
                        "training"))  # fmt: skip
        if f := self.of("conflict"):
            shown = "; ".join(" = ".join(x.paths[:2]) for x in f[:_SHOWN]) + (" ..." if len(f) > _SHOWN else "")
            unsure = _unsure(f, after_list=True)
            what = "the same picture is taught as each class"
            if linked := sum(x.detail["match"] == "linked" for x in f):  # (the walk counts a file once)
                unsure += f"; {linked:,} of them one file linked into two classes"
                first = "a linked file as the class reached first only"
                what = f"the run teaches {first}" if linked == len(f) else f"{what}, {first}"
            out.append(("conflict", f"{len(f):,} picture(s) filed under two or more classes ({shown}{unsure}): "
                        f"{what}"))  # fmt: skip
        if f := self.of("leak"):
            same = sum(x.detail["match"] == "identical" for x in f)
            fix = "; left out of the evaluation (--dedup-eval)" if dedup else ": the evaluation top-1 will read high"
            hint = "" if dedup else " (--dedup-eval leaves them out)"
            out.append(("leak", f"{len(f):,} evaluation image(s) are also in {self._train_folder()} ({same:,} "
                        f"identical, {len(f) - same:,} near copies{_unsure(f)}){fix}{hint}"))  # fmt: skip
        for x in self.of("imbalance"):
            small = ", ".join(f"{c} {n:,}" for c, n in list(x.detail["counts"].items())[:_SHOWN])
            more = f" and {len(x.detail['counts']) - _SHOWN} more" if len(x.detail["counts"]) > _SHOWN else ""
            ((big, n),) = x.detail["largest"].items()
            beside = "" if big in x.detail["counts"] else f", beside {big} {n:,} (mean {x.detail['mean']:g})"
            split = self.folders.get(x.detail["split"])  # (a folder of small classes only has no larger one beside)
            out.append(("imbalance", f"small classes in {f'{split}/' if split else 'the folder'}: {small}{more} "
                        f"image(s){beside}: their accuracy rests on few images"))  # fmt: skip
        if not out:
            n = sum(r.error is None for r in self.records)
            return [f"data check: {n:,} images, none unreadable, tiny or strip-shaped, no copies, leaks, conflicting "
                    "labels or small classes"]  # fmt: skip
        tail = f"; list in {where}" if where else ""
        return [f"data check: {kind}: {line}{tail}" for kind, line in out]

    def refusal(self) -> str | None:
        """What ``--strict-data`` stops on (leaks and conflicting labels that are sure: byte-identical, or near copies
        at :data:`~.perceptual.SURE_CORRELATION`; a crop or a look-alike is reported, not refused), in one line, or
        None."""
        parts = []
        if f := [x for x in self.of("leak") if x.detail["sure"]]:
            parts.append(f"{len(f):,} evaluation image(s) also in {self._train_folder()} (sure copies)")
        if f := [x for x in self.of("conflict") if x.detail["sure"]]:
            parts.append(f"{len(f):,} picture(s) under two or more classes (sure copies)")
        return " and ".join(parts) or None


def _unsure(found: list[Finding], *, after_list: bool = False) -> str:
    """``, N of them only similar (...)``: the findings not sure (a crop or a look-alike), or nothing when all are."""
    n = sum(not x.detail["sure"] for x in found)
    if not n:
        return ""
    what = "a crop or a look-alike: look before acting, --strict-data lets them pass"
    sep = "; " if after_list else ", "
    return f"{sep}{n:,} of them only similar ({what})"


def _findings(check: DataCheck, roles: list[str | None]) -> list[Finding]:
    """Every finding of ``check`` with these roles, in the order of :data:`KINDS`."""
    walk = [_walk_finding(check, p, why) for p, why in check.walk_problems]
    found = [
        *walk,
        *file_findings(check.records),
        *copy_findings(check.records, check.group, check.class_names, roles=roles, sure_group=check.sure_group),
        *imbalance_findings(check.records, check.class_names, roles=roles, folders=check.folders),
    ]
    order = {k: n for n, k in enumerate(KINDS)}
    return sorted(found, key=lambda f: (order.get(f.kind, len(order)), f.paths))


def _walk_finding(check: DataCheck, path: str, why: str) -> Finding:
    """A path the folder walk left out: ``unreadable`` (with the walk's reason), or ``conflict`` when it is a second
    path (a link) to a file the walk took under another class of the same split: the run teaches the picture as the
    class of the path reached first, and the other class never sees it."""
    link = check.linked.get(path)
    if link is not None:
        first, label = check.records[link[0]], link[1]
        if first.error is None and first.label != label:
            classes = [check.class_names[first.label], check.class_names[label]]
            return Finding("conflict", (first.rel, path), {"classes": classes, "match": "linked", "sure": True})
    return Finding("unreadable", (path,), {"reason": why})


def _linked(
    problems: list[tuple[str, str]], places: list[tuple[str, Path]], seen: dict[tuple[int, int], str],
    records: list[FileRecord], class_names: list[str], root: Path,
) -> dict[str, tuple[int, int]]:  # fmt: skip
    """:attr:`DataCheck.linked` of the walk's ``problems`` (``places[k]``: the split and folder of problem ``k``;
    ``seen``: the walk's files by ``(st_dev, st_ino)``, with the path that reached each first)."""
    index = {r.path: i for i, r in enumerate(records)}
    out = {}
    for (path, _), (split, folder) in zip(problems, places):
        try:
            st = os.stat(path)  # (a broken link, a folder or a FIFO is no file the walk took)
        except OSError:
            continue
        i = index.get(seen.get((st.st_dev, st.st_ino), ""))
        name = readable(os.path.relpath(path, folder).split(os.sep, 1)[0])
        if i is not None and records[i].split == split and records[i].path != path and name in class_names:
            out[_rel(path, root)] = (i, class_names.index(name))
    return out


def _split_folders(root: Path, *, val_split: float | None, every_eval: bool) -> list[tuple[str, Path, str]]:
    """``(split, folder, role)`` as a run reads ``root``: ``train/`` and its evaluation folder (``every_eval``: every
    one of :data:`~vitlab.data.sources.EVAL_DIRS` present), or one class tree (``train/``, else ``root``) whose
    evaluation split the run holds out."""
    train = root / "train"
    evals = [root / n for n in EVAL_DIRS if (root / n).is_dir()] if train.is_dir() else []
    if evals and val_split is None:
        return [("train", train, "train"), *((d.name, d, "eval") for d in (evals if every_eval else evals[:1]))]
    tree = train if train.is_dir() else root
    return [("train" if tree == train else ".", tree, "train")]


def check_folder(
    root: str | os.PathLike[str],
    *,
    val_split: float | None = None,
    every_eval: bool = False,
    workers: int = 2,
    progress: bool = True,
    max_pixels: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> DataCheck:
    """Check the image folder ``root`` (see the module's notes): ``train/`` and ``val/`` (or ``test/``: the first
    evaluation folder a run takes, or with ``every_eval`` all of them), or one class tree. ``val_split`` (as
    ``--val-split``): a tree, or ``train/`` alone, is what the run splits: its leaks are known once it has
    (:meth:`DataCheck.with_roles`). ``max_pixels``: the decompression-bomb guard (the run's). ``cache_dir``: where
    each file's hashes are kept for the next check (None: not kept). A folder the run could not read either (no
    class folders, a class folder without images) is the run's one-line :class:`~vitlab.errors.DataError`."""
    root = Path(root).expanduser()
    splits = _split_folders(root, val_split=val_split, every_eval=every_eval)
    seen: dict[tuple[int, int], str] = {}
    problems: list[tuple[str, str]] = []
    records: list[FileRecord] = []
    roles: list[str | None] = []
    class_names: list[str] | None = None
    places: list[tuple[str, Path]] = []
    for split, folder, role in splits:
        before = len(problems)
        paths, labels, names = scan_classes(folder, class_names, seen=seen, problems=problems)
        places += [(split, folder)] * (len(problems) - before)
        class_names = class_names or names
        records += [FileRecord(p, _rel(p, root), split, int(y)) for p, y in zip(paths, labels.tolist())]
        roles += [role] * len(paths)
    assert class_names is not None
    fps: Fingerprints = read_files(
        records, root=root, workers=workers, progress=progress, max_pixels=max_pixels,
        cache_dir=Path(cache_dir) if cache_dir is not None else None,
    )  # fmt: skip
    ok = np.array([r.error is None for r in records], dtype=bool)
    idx = np.flatnonzero(ok)
    i, j, _, r = near_pairs(fps.whole[idx], fps.centre[idx], fps.thumbs[idx], fps.mirror[idx])
    i, j = idx[i], idx[j]
    sure = r >= SURE_CORRELATION
    near = sum(records[a].digest != records[b].digest for a, b in zip(i.tolist(), j.tolist()))
    check = DataCheck(
        root=root,
        records=records,
        class_names=class_names,
        folders={s: readable(os.path.relpath(f, root)).replace(os.sep, "/").removeprefix(".") for s, f, _ in splits},
        roles=roles,
        group=groups(records, i, j),
        sure_group=groups(records, i[sure], j[sure]),
        walk_problems=[(_rel(p, root), why) for p, why in problems],
        linked=_linked(problems, places, seen, records, class_names, root),
        findings=[],
        held_out=len(splits) == 1,
        near=near,
    )
    check.findings = _findings(check, roles)
    return check
