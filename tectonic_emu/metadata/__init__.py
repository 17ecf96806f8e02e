"""Metadata: the ordered, transactional key-value seam and its backends."""

from tectonic_emu.metadata._common import GroupCommit
from tectonic_emu.metadata._memory import MemoryKV
from tectonic_emu.metadata._postgres import PostgresKV
from tectonic_emu.metadata._sqlite import SQLiteKV
from tectonic_emu.metadata.kv import KVStore, Transaction, prefix_end

__all__ = [
    "GroupCommit",
    "KVStore",
    "MemoryKV",
    "PostgresKV",
    "SQLiteKV",
    "Transaction",
    "prefix_end",
]
