"""An ONNX graph, checked before it runs and bounded while it runs: the one place vitlab turns an ``.onnx`` file
into an onnxruntime session (:func:`open_session`), for an exported folder (:func:`vitlab.deploy.open_exported`)
and a single file (:func:`vitlab.deploy.load_exported`) alike.

A graph is data from a file. vitlab reads it with ``onnx`` first (the weights inside it included, never a file it
points to) and refuses, before onnxruntime sees it, in one line naming the file:

- control flow and sub-graphs (``Loop``, ``If``, ``Scan``, ``SequenceMap``, any node that holds a graph, local
  functions): vitlab's exporter never writes them, and a ``Loop`` of 10**15 iterations would run for ever;
- external weights anywhere but ``<file>.data`` beside the file (a location may name any file of the disk);
- inputs and outputs other than ``pixel_values`` ``(batch, C, H, W)`` and ``logits`` ``(batch, classes)``;
- an opset of the standard domain outside :data:`MIN_OPSET` .. the installed ``onnx``'s newest;
- non-finite weights (a model that can only answer NaN).

What passes runs in onnxruntime on the CPU. A graph vitlab did not write (in an exported folder: no content hash
in its ``config.json``, or another one) also runs under a time limit per batch (:func:`run_seconds`): a timer sets
onnxruntime's ``terminate`` flag. The hash tells a graph vitlab wrote from one changed since; it is not a
signature (whoever edits the graph can edit the config), which is why the refusals above apply to every graph.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, VitlabError

__all__ = [
    "CONTROL_FLOW",
    "MAX_GRAPH_BYTES",
    "MIN_OPSET",
    "ExportError",
    "GraphFacts",
    "GraphSession",
    "check_opset",
    "file_digest",
    "max_opset",
    "open_session",
    "read_graph",
    "run_seconds",
]

CONTROL_FLOW = frozenset({"Loop", "If", "Scan", "SequenceMap"})
"""Operators that run a sub-graph (for a count of iterations the graph itself may choose): never in a vitlab
export, refused in every graph (so is any other node holding a graph attribute)."""
MIN_OPSET = 17
"""The oldest opset a ViT graph can be written in: ``LayerNormalization`` came with opset 17."""
MAX_GRAPH_BYTES = 2**31
"""An ``.onnx`` file is one protobuf message, which cannot pass 2 GiB (larger weights go to ``<file>.data``)."""
BASE_RUN_SECONDS = 60.0
MACS_PER_SECOND = 1e9
MAX_RUN_SECONDS = 900.0
"""A graph vitlab did not write gets ``BASE_RUN_SECONDS`` plus its batch's multiply-accumulates at
``MACS_PER_SECOND`` (a tenth of what one slow core does) per batch, at most ``MAX_RUN_SECONDS``."""
_FLOAT_TYPES = (1, 10, 11, 16)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
_GRAPH_ATTRS = (5, 10)  # AttributeProto.GRAPH, GRAPHS


class ExportError(VitlabError, RuntimeError):
    """An export that failed, a missing optional dependency, or a parity check that did not pass."""


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as e:
        raise ExportError("reading an .onnx model needs onnx and onnxruntime: pip install 'vitlab[onnx]'") from e
    return onnx


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise ExportError("running an .onnx model needs onnxruntime: pip install 'vitlab[onnx]'") from e
    return onnxruntime


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def max_opset() -> int:
    """The newest standard-domain opset the installed ``onnx`` knows."""
    return int(_onnx().defs.onnx_opset_version())


def check_opset(opset: Any, *, flag: str = "--opset") -> int:
    """``opset`` as an opset number vitlab can export at, or a one-line :class:`ExportError` naming ``flag``."""
    if isinstance(opset, bool) or not isinstance(opset, int):
        raise ExportError(f"{flag}: expected an integer opset, got {opset!r}")
    top = max_opset()
    if not MIN_OPSET <= opset <= top:
        raise ExportError(
            f"{flag} {opset}: ONNX opsets a ViT can be exported at are {MIN_OPSET}..{top} (LayerNormalization needs "
            f"{MIN_OPSET}; {top} is the newest the installed onnx knows)"
        )
    return opset


@dataclass(frozen=True)
class GraphFacts:
    """What a checked graph states about itself."""

    opset: int
    """The standard domain's opset the graph imports."""
    input_shape: tuple[int | None, ...]
    """``pixel_values``' shape, ``None`` where a dimension is symbolic (the batch)."""
    output_shape: tuple[int | None, ...]
    """``logits``' shape, likewise."""


def _shape(value: Any) -> tuple[int | None, ...]:
    dims = value.type.tensor_type.shape.dim
    return tuple(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims)


def _check_nodes(where: str, nodes: Sequence[Any]) -> None:
    for node in nodes:
        if node.op_type in CONTROL_FLOW or any(a.type in _GRAPH_ATTRS for a in node.attribute):
            raise CheckpointError(
                f"{where}: holds a {node.op_type} node (control flow); vitlab's exports never do, and such a node "
                "may run for ever, so the graph is not run"
            )


def read_graph(path: str | os.PathLike[str]) -> GraphFacts:
    """Read and check the ONNX graph in ``path`` (see the module's docstring) without running it; the facts
    the caller compares with what it expects. Raises a one-line :class:`~vitlab.errors.CheckpointError`."""
    onnx = _onnx()
    from onnx import numpy_helper

    p = Path(path)
    where = str(p)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise CheckpointError(f"{where}: cannot read it ({e.strerror or e})") from None
    if size > MAX_GRAPH_BYTES:
        raise CheckpointError(f"{where}: {size:,} bytes, larger than one ONNX protobuf can be (2 GiB)")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf and onnx raise their own error types
        raise CheckpointError(f"{where}: not an ONNX graph ({_first_line(e)})") from None
    if len(model.functions):
        raise CheckpointError(f"{where}: holds local functions; vitlab's exports never do, so the graph is not run")
    graph = model.graph
    _check_nodes(where, graph.node)
    opsets = {o.domain or "ai.onnx": int(o.version) for o in model.opset_import}
    opset = opsets.get("ai.onnx")
    if opset is None or not MIN_OPSET <= opset <= max_opset():
        raise CheckpointError(f"{where}: imports ONNX opset {opset}, not one of {MIN_OPSET}..{max_opset()}")
    weights = {t.name for t in graph.initializer}
    inputs = [v for v in graph.input if v.name not in weights]
    if [v.name for v in inputs] != ["pixel_values"] or [v.name for v in graph.output] != ["logits"]:
        raise CheckpointError(
            f"{where}: takes {[v.name for v in inputs]} and gives {[v.name for v in graph.output]}; a vitlab export "
            "takes ['pixel_values'] and gives ['logits']"
        )
    facts = GraphFacts(opset=opset, input_shape=_shape(inputs[0]), output_shape=_shape(graph.output[0]))
    if len(facts.input_shape) != 4 or len(facts.output_shape) != 2:
        raise CheckpointError(
            f"{where}: pixel_values has {len(facts.input_shape)} dimensions and logits {len(facts.output_shape)}; "
            "a vitlab export takes (batch, C, H, W) and gives (batch, classes)"
        )
    data_file = f"{p.name}.data"
    for t in graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = {e.key: e.value for e in t.external_data}.get("location")
            if location != data_file:
                raise CheckpointError(
                    f"{where}: weight {t.name!r} is stored in {location!r}, not in {data_file} beside the file; "
                    "refusing to read files a graph names"
                )
            continue
        if t.data_type in _FLOAT_TYPES and not _finite(numpy_helper.to_array(t)):
            raise CheckpointError(f"{where}: weight {t.name!r} holds NaN or infinite values; the model cannot predict")
    return facts


def _finite(a: np.ndarray) -> bool:
    """Whether a graph's float tensor is usable: no NaN, and no infinity but as a constant of one element (the
    fill value of a padding, as the hybrid's ResNet stem pads its 'SAME' max pooling with -inf)."""
    return not np.isnan(a).any() and (a.size == 1 or bool(np.isfinite(a).all()))


def file_digest(paths: Sequence[str | os.PathLike[str]]) -> str:
    """``sha256:<hex>`` of the bytes of ``paths`` one after the other (the model file and its external data)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                h.update(block)
    return f"sha256:{h.hexdigest()}"


def run_seconds(macs_per_image: int, batch: int) -> float:
    """The time limit of one batch of a graph vitlab did not write (see :data:`MAX_RUN_SECONDS`)."""
    return min(MAX_RUN_SECONDS, BASE_RUN_SECONDS + max(0, macs_per_image) * max(1, batch) / MACS_PER_SECOND)


class GraphSession:
    """An onnxruntime session of a checked graph (:func:`open_session`): :meth:`logits` runs a batch, under the
    session's time limit when it has one, and any failure of onnxruntime is one line naming the file. Other
    attributes are the session's own (``get_inputs()`` ...)."""

    def __init__(self, session: Any, *, path: Path, facts: GraphFacts, limit: Any = None) -> None:
        self.session, self.path, self.facts = session, path, facts
        self.limit = limit
        """None (no time limit), or a function of the batch size giving seconds (:func:`run_seconds`)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["session"], name)

    def run(self, output_names: Any, feed: dict[str, np.ndarray], run_options: Any = None) -> list[np.ndarray]:
        """onnxruntime's ``run``, bounded and with one-line errors."""
        ort = _ort()
        seconds = None if self.limit is None else float(self.limit(len(next(iter(feed.values())))))
        opts = run_options or ort.RunOptions()
        opts.log_severity_level = 4  # (onnxruntime logs a terminated run as an error of its own: ours says it)
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            opts.terminate = True

        timer = threading.Timer(seconds, stop) if seconds is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            return self.session.run(output_names, feed, opts)
        except Exception as e:  # onnxruntime raises its own error types
            if stopped.is_set():
                raise CheckpointError(
                    f"{self.path}: stopped after {seconds:.3g} s on a batch of {len(next(iter(feed.values())))}: "
                    "a graph vitlab did not write (no matching content hash) runs under a time limit"
                ) from None
            shape = "x".join(str(d) for d in next(iter(feed.values())).shape)
            raise CheckpointError(f"{self.path}: onnxruntime cannot run it on {shape} ({_first_line(e)})") from None
        finally:
            if timer is not None:
                timer.cancel()

    def logits(self, pixel_values: np.ndarray) -> np.ndarray:
        """The graph's logits for a float32 ``(N, C, H, W)`` batch."""
        x = np.ascontiguousarray(pixel_values, dtype=np.float32)
        return self.run(["logits"], {"pixel_values": x})[0]


def open_session(
    path: str | os.PathLike[str], *, threads: int | None = None, limit: Any = None, facts: GraphFacts | None = None
) -> GraphSession:
    """The checked graph in ``path`` (:func:`read_graph`, unless its ``facts`` were read already) as a
    :class:`GraphSession` on the CPU. ``threads``: onnxruntime's intra-op threads (default: its own). ``limit``:
    the time limit of a batch, a function of its size (None: none, for a graph vitlab wrote)."""
    p = Path(path)
    facts = facts or read_graph(p)
    ort = _ort()
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(str(p), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own error types
        raise CheckpointError(f"{p}: onnxruntime cannot load it ({_first_line(e)})") from None
    return GraphSession(session, path=p, facts=facts, limit=limit)
