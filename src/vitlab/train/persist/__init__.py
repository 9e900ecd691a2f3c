"""WHAT survives a training process: :mod:`.position` (where the run is, what it plans), :mod:`.saver` (``last.pt``,
sharded checkpoints, ``model/``: :class:`~.saver.CheckpointSaver`), :mod:`.state` and :mod:`.dcp` (how they are
written and read back safely), :mod:`.outputs` (the run folder, ``metrics.jsonl``, ``summary.json``),
:mod:`.figures` and :mod:`.advice`."""
