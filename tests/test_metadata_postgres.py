"""A cluster whose metadata lives in PostgreSQL (issue 8): created, used and read back from
other processes, as from other hosts, with clear errors for a table in use or a database
that cannot be reached."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clients.checkpoint import Checkpointer
from tectonic_emu import Cluster
from tectonic_emu.errors import AlreadyExistsError
from tectonic_emu.metadata import PostgresKV
from tests.conftest import SMALL_BLOCK, fresh_table
from tests.kv_holder import resume_refused, stopped_holder


def cli(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "tectonic_emu", *args], input=input, capture_output=True
    )


def test_a_cluster_on_postgres_serves_every_process(tmp_path: Path, postgres_url: str) -> None:
    """Created with --metadata, the cluster keeps no SQLite file; a file put by one process
    and a checkpoint saved by another are read back by a third, whose listing and status
    agree; the metadata is in the table."""
    table = fresh_table()
    root = tmp_path / "c"
    made = cli(
        "cluster", "create", "--cluster", str(root), "--nodes", "9", "--encoding", "rs-6-3",
        "--block-size", str(SMALL_BLOCK), "--metadata", postgres_url, "--metadata-table", table,
        "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["metadata_table"] == table
    payload = os.urandom(5 * SMALL_BLOCK + 123)
    made = cli("mkdir", "--cluster", str(root), "/data")
    assert made.returncode == 0, made.stderr
    put = cli("put", "--cluster", str(root), "-", "/data/blob", input=payload)
    assert put.returncode == 0, put.stderr

    async def save() -> None:
        async with Cluster.open(root) as cluster:
            ckpt = Checkpointer(cluster.client(), "/ckpt", world_size=4)
            arrays = [np.full(1000, r, dtype=np.float32) for r in range(4)]
            await asyncio.gather(*(ckpt.save(7, r, {"w": a}) for r, a in enumerate(arrays)))
            await ckpt.close()

    asyncio.run(save())
    got = cli("get", "--cluster", str(root), "/data/blob", "-")
    assert got.returncode == 0, got.stderr
    assert got.stdout == payload
    listing = cli("ls", "--cluster", str(root), "/", "--json")
    assert listing.returncode == 0, listing.stderr
    assert {"/ckpt", "/data"} <= {e["path"] for e in json.loads(listing.stdout)}

    async def load() -> list[float]:
        async with Cluster.open(root) as cluster:
            ckpt = Checkpointer(cluster.client(), "/ckpt", world_size=4)
            states = await ckpt.load_many(range(4), 7)
            await ckpt.close()
            return [float(s["w"][0]) for s in states]

    assert asyncio.run(load()) == [0.0, 1.0, 2.0, 3.0]
    assert not (root / "metadata.db").exists()

    async def keys() -> int:
        kv = PostgresKV(postgres_url, table=table)
        try:
            return await kv.count()
        finally:
            await kv.close()

    assert asyncio.run(keys()) > 10


def test_create_refuses_a_table_in_use_and_an_unreachable_database(
    tmp_path: Path, postgres_url: str
) -> None:
    table = fresh_table()
    Cluster.create(tmp_path / "a", nodes=3, encoding="r3", metadata=postgres_url,
                   metadata_table=table)  # fmt: skip

    async def touch() -> None:
        async with Cluster.open(tmp_path / "a"):
            pass  # writes the root directory's record

    asyncio.run(touch())
    with pytest.raises(AlreadyExistsError):
        Cluster.create(tmp_path / "b", nodes=3, encoding="r3", metadata=postgres_url,
                       metadata_table=table)  # fmt: skip
    assert not (tmp_path / "b" / "cluster.json").exists()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nowhere = f"postgresql://tectonic:secret@127.0.0.1:{port}/postgres"
    with pytest.raises(OSError) as info:
        Cluster.create(tmp_path / "c", nodes=3, encoding="r3", metadata=nowhere)
    assert info.value.errno == errno.ECONNREFUSED
    shown = cli("cluster", "create", "--cluster", str(tmp_path / "d"), "--metadata", nowhere)
    assert shown.returncode == 1
    assert b"Traceback" not in shown.stderr and b"secret" not in shown.stderr
    assert b"tectonic-emu: error:" in shown.stderr
    bad = cli("cluster", "create", "--cluster", str(tmp_path / "e"), "--metadata", "mysql://x/y")
    assert bad.returncode != 0 and b"postgresql://" in bad.stderr


def test_a_stopped_client_holding_a_transaction_blocks_others_only_for_its_lease(
    postgres_url: str,
) -> None:
    """A client SIGSTOPped while it holds the lock (inside a transaction) is ended by the
    server after its lease: another client gets the lock instead of waiting for it forever,
    and the stopped one, resumed, finds its transaction gone, none of it committed."""
    table = fresh_table()
    lease = 2.0
    with stopped_holder("postgres", postgres_url, str(lease), table) as holder:

        async def other() -> bytes | None:
            # Without the lease this waits for the lock until busy_timeout and fails EBUSY.
            kv = PostgresKV(postgres_url, table=table, busy_timeout=lease * 10)
            try:
                async with kv.transaction() as t:
                    await t.put(b"k", b"from the other client")
                    return await t.get(b"k")
            finally:
                await kv.close()

        assert asyncio.run(other()) == b"from the other client"
        resume_refused(holder)

    async def value() -> bytes | None:
        kv = PostgresKV(postgres_url, table=table)
        try:
            return await kv.get(b"k")
        finally:
            await kv.close()

    assert asyncio.run(value()) == b"from the other client"
