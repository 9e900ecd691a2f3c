"""What the data check finds, from the records of one pass (:mod:`.records`): the kinds, their thresholds, and the
findings, each a ``kind`` and the ``paths`` it is about (relative to the checked folder) with what else that kind
says. Other kinds join by adding a name to :data:`KINDS` and their findings to the list (the label issues a model
finds will be ``label_issue``: a path, its given class, the suggested class and a score).

- ``unreadable``: a file the run cannot use (empty, truncated, not an image, a decompression bomb) or the folder walk
  left out (a broken link, a link loop, a FIFO, a second path to one file), with the reason;
- ``tiny``: a picture whose shorter side is under :data:`TINY_SIDE` pixels in a folder of larger pictures (a typical
  shorter side of :data:`TINY_AMONG` times that or more: a thumbnail among photos; a folder of small images, digits
  or icons, is what it is);
- ``extreme_aspect``: a strip, one side more than :data:`EXTREME_ASPECT` times the other (over
  :data:`~vitlab.data.images.decode.MAX_ASPECT` a run leaves it out);
- ``duplicate``: the same picture more than once in one class of one split (byte-identical, or a near copy);
- ``conflict``: the same picture under two or more classes (``match`` ``linked``: one file reached by a link from
  another class, which the folder walk counts once, under the class reached first: :mod:`vitlab.data.check`);
- ``leak``: a picture of the evaluation split also in training (byte-identical or a near copy), one finding per
  evaluation image, its training copies after it;
- ``imbalance``: classes of the training split with fewer than :data:`MIN_CLASS_SHARE` of the mean class's images,
  or fewer than :data:`FEW_IMAGES` (cleanlab's class-imbalance rule, plus near-empty classes).

"The same picture": two files with the same content hash, or a pair of near copies
(:func:`~vitlab.data.check.perceptual.near_pairs`), and what such pairs link together (a group). A ``duplicate``,
``conflict`` or ``leak`` is ``sure`` when byte-identical files or near copies correlated at least
:data:`~vitlab.data.check.perceptual.SURE_CORRELATION` make it (re-encoded, resized copies), not only a crop or a
look-alike; ``--strict-data`` stops on sure ones only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..images.decode import MAX_ASPECT
from .records import FileRecord

__all__ = [
    "EXTREME_ASPECT",
    "FEW_IMAGES",
    "KINDS",
    "MIN_CLASS_SHARE",
    "TINY_AMONG",
    "TINY_SIDE",
    "Finding",
    "copy_findings",
    "file_findings",
    "groups",
    "imbalance_findings",
]

KINDS = ("unreadable", "tiny", "extreme_aspect", "duplicate", "conflict", "leak", "imbalance")
"""Every kind of finding, in the order a report lists them."""
TINY_SIDE = 16
"""A picture whose shorter side is under this many pixels is ``tiny``: smaller than one patch of a ViT-B/16, it
trains as a blurred enlargement (a thumbnail saved by mistake, an icon) ..."""
TINY_AMONG = 4
"""... when the folder's typical (median) shorter side is at least this many times :data:`TINY_SIDE`: a folder of
8-px or 28-px images (digits, MNIST, the project's tests) trains at its own size, and nothing in it is tiny."""
EXTREME_ASPECT = 8.0
"""A picture whose longer side is more than this many times its shorter is ``extreme_aspect`` (a strip: a banner,
a scan of a receipt); its centre square keeps a sliver of it. Photos are 1:1 to 16:9, panoramas about 1:4."""
MIN_CLASS_SHARE = 0.1
"""A class of the training split with fewer images than this share of the mean class's is ``imbalance`` (cleanlab's
``class_imbalance`` rule, its default threshold)."""
FEW_IMAGES = 5
"""A class of the training split with fewer images than this is near-empty: ``imbalance`` whatever the others."""


@dataclass(frozen=True)
class Finding:
    """One finding: its ``kind`` (:data:`KINDS`), the ``paths`` it is about (relative to the checked folder) and what
    else the kind says (``detail``: a reason, a size, classes, how the copies match)."""

    kind: str
    paths: tuple[str, ...]
    detail: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """As the JSON report holds it: ``{"kind": ..., "paths": [...], ...detail}``."""
        return {"kind": self.kind, "paths": list(self.paths), **self.detail}


def file_findings(
    records: Sequence[FileRecord],
    *,
    tiny_side: int = TINY_SIDE,
    extreme_aspect: float = EXTREME_ASPECT,
) -> list[Finding]:
    """``unreadable``, ``tiny`` and ``extreme_aspect``: what one file says about itself (``tiny`` beside the folder's
    typical picture, :data:`TINY_AMONG`)."""
    found = []
    sides = [min(r.size) for r in records if r.error is None and r.size is not None]
    typical = int(np.median(sides)) if sides else 0
    tiny_side = tiny_side if typical >= TINY_AMONG * tiny_side else 0
    for r in records:
        if r.error is not None:
            found.append(Finding("unreadable", (r.rel,), {"reason": r.error}))
            continue
        if r.size is None:
            continue
        w, h = r.size
        if min(w, h) < tiny_side:
            found.append(Finding("tiny", (r.rel,), {"size": [w, h]}))
        ratio = max(w, h) / max(1, min(w, h))
        if ratio > extreme_aspect:
            left_out = ratio > MAX_ASPECT
            found.append(Finding("extreme_aspect", (r.rel,), {"size": [w, h], "aspect": round(ratio, 2),
                                                               "left_out": left_out}))  # fmt: skip
    return found


def groups(records: Sequence[FileRecord], near_i: np.ndarray, near_j: np.ndarray) -> np.ndarray:
    """The group of each record (an int64 label; a record alone is its own group): records with the same content
    hash, and the near pairs ``(near_i[k], near_j[k])``, joined (union-find). Unreadable records stay alone."""
    parent = np.arange(len(records))

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return int(root)

    def join(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    first: dict[str, int] = {}
    for i, r in enumerate(records):
        if r.digest is not None and r.error is None:
            join(first.setdefault(r.digest, i), i)
    for a, b in zip(near_i.tolist(), near_j.tolist()):
        join(a, b)
    return np.array([find(i) for i in range(len(records))], dtype=np.int64)


def _match(members: Sequence[FileRecord]) -> str:
    """``identical`` when the files share one content hash, else ``near``."""
    return "identical" if len({m.digest for m in members}) == 1 else "near"


def copy_findings(
    records: Sequence[FileRecord],
    group: np.ndarray,
    class_names: Sequence[str],
    *,
    roles: Sequence[str | None],
    sure_group: np.ndarray | None = None,
) -> list[Finding]:
    """``duplicate``, ``conflict`` and ``leak`` from the records' groups (:func:`groups`). ``roles[i]``: what record
    ``i`` is in the run, ``train``, ``eval`` or None (not in it: unreadable, or left out). ``sure_group``: the groups
    of the identical files and the sure pairs alone (None: every group is sure), which make a finding ``sure``."""
    sure = group if sure_group is None else sure_group
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group.tolist()):
        if records[i].error is None and records[i].digest is not None:
            members.setdefault(g, []).append(i)
    found: list[Finding] = []
    for idx in members.values():
        if len(idx) < 2:
            continue
        by_place: dict[tuple[str, int], list[int]] = {}
        for i in idx:
            by_place.setdefault((records[i].split, records[i].label), []).append(i)
        for (split, label), same in by_place.items():
            if len(same) > 1:
                rs = [records[i] for i in same]
                found.append(Finding("duplicate", tuple(r.rel for r in rs), {
                    "split": split, "class": class_names[label], "match": _match(rs),
                    "sure": len({int(sure[i]) for i in same}) < len(same)}))  # fmt: skip
        labels = sorted({records[i].label for i in idx})
        if len(labels) > 1:
            rs = [records[i] for i in idx]
            sure_labels: dict[int, set[int]] = {}
            for i in idx:
                sure_labels.setdefault(int(sure[i]), set()).add(records[i].label)
            found.append(Finding("conflict", tuple(r.rel for r in rs), {
                "classes": [class_names[r.label] for r in rs], "match": _match(rs),
                "sure": any(len(v) > 1 for v in sure_labels.values())}))  # fmt: skip
        train = [i for i in idx if roles[i] == "train"]
        if train:
            digests = {records[i].digest for i in train}
            sure_train = {int(sure[i]) for i in train}
            for i in idx:
                if roles[i] != "eval":
                    continue
                r = records[i]
                match = "identical" if r.digest in digests else "near"
                found.append(Finding("leak", (r.rel, *(records[t].rel for t in train)), {
                    "split": r.split, "class": class_names[r.label], "match": match,
                    "sure": int(sure[i]) in sure_train}))  # fmt: skip
    return found


def imbalance_findings(
    records: Sequence[FileRecord],
    class_names: Sequence[str],
    *,
    roles: Sequence[str | None],
    folders: dict[str, str],
    min_share: float = MIN_CLASS_SHARE,
    few: int = FEW_IMAGES,
) -> list[Finding]:
    """``imbalance``: one finding per training split folder whose decodable images leave some classes far below the
    mean (``min_share`` of it) or near-empty (fewer than ``few``); ``folders`` maps a split to its folder relative to
    the checked one (``""`` for a class tree), whose class folders the finding's paths are."""
    found = []
    splits = sorted({r.split for r, role in zip(records, roles) if role is not None and r.error is None})
    for split in splits:
        counts = np.zeros(len(class_names), dtype=np.int64)
        trains = False
        for r, role in zip(records, roles):
            if r.split == split and r.error is None and role is not None:
                counts[r.label] += 1
                trains |= role == "train"
        if not trains:
            continue
        mean = counts.sum() / max(1, len(class_names))
        small = [k for k in range(len(class_names)) if counts[k] < max(few, min_share * mean)]
        if not small:
            continue
        prefix = f"{folders[split]}/" if folders.get(split) else ""
        found.append(Finding("imbalance", tuple(f"{prefix}{class_names[k]}" for k in small), {
            "split": split,
            "counts": {class_names[k]: int(counts[k]) for k in small},
            "mean": round(float(mean), 1),
            "largest": {class_names[int(counts.argmax())]: int(counts.max())},
        }))  # fmt: skip
    return found
