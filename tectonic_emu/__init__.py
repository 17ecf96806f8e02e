"""tectonic-emu: an emulator of Meta's Tectonic storage for AI training.

import asyncio, tectonic_emu

tectonic_emu.Cluster.create("/tmp/c1", nodes=9, encoding="rs-6-3")

async def main():
    async with tectonic_emu.Cluster.open("/tmp/c1") as cluster:
        client = cluster.client()
        await client.write_file("/hello", b"world")
        assert await client.read_file("/hello") == b"world"

asyncio.run(main())
"""

from tectonic_emu.client import BlockLayout, Client, Stat
from tectonic_emu.cluster import Cluster, ClusterStatus, NodeStatus
from tectonic_emu.coding import Encoding
from tectonic_emu.config import ClusterConfig
from tectonic_emu.errors import *  # noqa: F403 - the error vocabulary is part of the API
from tectonic_emu.errors import __all__ as _errors
from tectonic_emu.writer import FileWriter

__all__ = [
    "BlockLayout",
    "Client",
    "Cluster",
    "ClusterConfig",
    "ClusterStatus",
    "Encoding",
    "FileWriter",
    "NodeStatus",
    "Stat",
    *_errors,
]
