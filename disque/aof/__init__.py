"""The append-only file (AOF): logging jobs, reloading them, compacting the log.

docs/PERSISTENCE.md is the guide (format, what is logged, fsync policies,
rewrites, damage and repair).  The rooms:

* ``records``: how each record is written;
* ``reader``: reading records back, telling a torn tail from corruption,
  replaying them into a job table;
* ``file``: the node's AOF (``AppendOnlyFile``): the records a turn logged,
  written before the replies, the fsync policy, loading at start-up, INFO;
* ``rewrite``: the incremental rewrite, in the event loop, without a fork;
* ``background``: the thread that fsyncs and closes files;
* ``check``: ``disque-check-aof``.

What a restart makes of the loaded jobs is the node's policy, not the
file's: ``disque/restore.py``.
"""

from .file import AppendOnlyFile, setup_persistence
from .reader import AofCorruptError, AofReader, BlobDecoder, Damage, LoadResult, Record, read_aof
from .records import (
    KIND_DELJOB,
    KIND_IDMP,
    KIND_LOADJOB,
    KIND_MARK,
    dehydrated_ack_record,
    deljob_record,
    idmp_record,
    loadjob_record,
    mark_record,
    snapshot_record,
)
from .rewrite import REWRITE_STEP_BUDGET_S, Rewrite

__all__ = [
    "AppendOnlyFile",
    "AofCorruptError",
    "AofReader",
    "BlobDecoder",
    "Damage",
    "KIND_DELJOB",
    "KIND_IDMP",
    "KIND_LOADJOB",
    "KIND_MARK",
    "LoadResult",
    "REWRITE_STEP_BUDGET_S",
    "Record",
    "Rewrite",
    "dehydrated_ack_record",
    "deljob_record",
    "idmp_record",
    "loadjob_record",
    "mark_record",
    "read_aof",
    "setup_persistence",
    "snapshot_record",
]
