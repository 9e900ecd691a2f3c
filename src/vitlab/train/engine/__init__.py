"""HOW one process runs a training run: :mod:`.run` (``fit``, top to bottom), :mod:`.trainer` (the
:class:`~.trainer.Trainer`), :mod:`.loop` (one epoch), :mod:`.schedule` (what step s looks like: LR, resolution,
token dropping, the head-only phase), :mod:`.model`, :mod:`.optim`, the data and its loaders (:mod:`.run_data`,
:mod:`.loaders`, :mod:`.shards`, :mod:`.navit`: images at their own aspect ratio packed into sequences),
:mod:`.parallel` (DDP, FSDP2), :mod:`.watch` (attention health), :mod:`.signals` and :mod:`.messages` (what the run
prints). How much the run gets (the time budget, the memory fit, threads) is chosen in :mod:`vitlab.train.sizing`."""
