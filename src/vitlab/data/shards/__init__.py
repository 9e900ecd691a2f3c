"""WebDataset-style tar shards: writing them (``vitlab data pack``), their manifest, the spellings ``--data`` may
use, reading them and streaming an epoch from them."""
