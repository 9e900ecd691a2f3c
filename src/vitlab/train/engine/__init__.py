"""HOW one process runs a training run: :mod:`.run` (``fit``, top to bottom), :mod:`.trainer` (the
:class:`~.trainer.Trainer`), :mod:`.loop` (one epoch), :mod:`.schedule` (what step s looks like: LR, resolution,
token dropping, the head-only phase), :mod:`.budget` (``--time-budget``), :mod:`.model`, :mod:`.optim`,
:mod:`.memory`, the loaders (:mod:`.loaders`, :mod:`.shards`, :mod:`.data`), :mod:`.parallel` (DDP, FSDP2),
:mod:`.signals` and :mod:`.messages` (what the run prints)."""
