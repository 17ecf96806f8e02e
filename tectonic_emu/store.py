"""What the client and the services use of an open cluster, and nothing more.

``StoreView`` names the four things a ``Client``, ``scrub`` and ``repair`` reach through the
cluster they are given: its config, its metadata, its data path and its storage nodes.
``Cluster`` has them (so ``Client(cluster)`` and ``repair(cluster)`` work as before), but it
also opens the store and controls node processes, which is why the client and the services
name this protocol instead: they sit below ``cluster.py`` and never import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tectonic_emu.chunkstore.base import StorageNode
from tectonic_emu.config import ClusterConfig
from tectonic_emu.datapath import DataPath
from tectonic_emu.metadata.layers import Metadata


class StoreView(Protocol):
    """The config, metadata, data path and storage nodes of one open cluster."""

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def meta(self) -> Metadata: ...

    @property
    def datapath(self) -> DataPath: ...

    @property
    def nodes(self) -> Sequence[StorageNode]: ...


__all__ = ["StoreView"]
