"""Run several ``vitlab`` command lines one after another in each process of one torchrun launch
(``python -m torch.distributed.run ... tests/torchrun_worker.py ARGV_JSON``): the tests pay the
launch and the imports once.

A process group made again after ``destroy_process_group`` takes the same names in torchrun's
key-value store as the one before, and a rank that starts the next command first can read the
previous group's stale entries and wait on a dead connection. So each command here joins a group
under its own prefix in the store, made before the command runs (``vitlab`` then uses it, and
destroys it when the command ends, as it destroys the group it makes itself).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch.distributed as dist

from vitlab.cli import main


def join(prefix: str) -> None:
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        False,  # a client of the store torchrun's agent holds
        timeout=timedelta(seconds=120),
    )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=world)


if __name__ == "__main__":
    for i, argv in enumerate(json.loads(sys.argv[1])):
        join(f"vitlab-test-command-{i}")
        rc = main(argv)
        if rc:
            sys.exit(rc)
    # Every command returned 0 and wrote its results: the process ends here, before the interpreter's teardown. There
    # torch destroys what outlived the commands (DTensor's module-level caches keep FSDP2's device mesh, and the mesh
    # its process group, past destroy_process_group), and destroying gloo's threads then can abort a rank: once in CI
    # (2026-12-01), rank 1 of a launch whose five commands had all finished ended with "terminate called without an
    # active exception" (SIGABRT), and the launch failed. What the tests check is each command's exit status.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
