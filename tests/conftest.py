"""Shared fixtures: fresh embedded clusters in tmp_path."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings

from tectonic_emu import Cluster
from tectonic_emu.client import Client

T = TypeVar("T")

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("default")

SMALL_BLOCK = 64 << 10


def make_cluster(
    root: Path,
    *,
    nodes: int = 9,
    encoding: str = "rs-6-3",
    block_size: int = SMALL_BLOCK,
    **kw: Any,
) -> Path:
    Cluster.create(root, nodes=nodes, encoding=encoding, block_size=block_size, **kw)
    return root


def run_with(root: Path, fn: Callable[[Cluster], Awaitable[T]]) -> T:
    """Open the cluster at ``root``, run ``fn(cluster)``, close it."""

    async def go() -> T:
        async with Cluster.open(root) as cluster:
            return await fn(cluster)

    return asyncio.run(go())


_fresh_roots = itertools.count()


def fresh_root() -> str:
    """A store directory name no other call in this test run got."""
    return f"/ckpt{next(_fresh_roots)}"


def run_in_fresh_root(cluster_dir: Path, body: Callable[[Client, str], Awaitable[T]]) -> T:
    """Run ``body(client, a store directory no other call got)`` on the cluster at
    ``cluster_dir`` (the checkpoint tests: one cluster per module, a root per test)."""
    root = fresh_root()

    async def main() -> T:
        async with Cluster.open(cluster_dir) as cluster:
            return await body(cluster.client(), root)

    return asyncio.run(main())


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    yield make_cluster(tmp_path / "cluster", nodes=15)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A private PostgreSQL server for this test session (``bench/postgres.py``). Without
    the server's binaries the tests that need it skip, except in CI (``CI=true``), whose
    set-up installs them: there a missing server fails instead of hiding."""
    import os

    from bench.postgres import PostgresServer, bin_dir

    pytest.importorskip("asyncpg")
    found = bin_dir()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no PostgreSQL server here (scripts/bootstrap.sh installs postgresql)")
        pytest.skip("no PostgreSQL server here (apt-get install postgresql)")
    server = PostgresServer(found).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: Any) -> str:
    return str(postgres_server.url)


_tables = iter(range(1, 1 << 30))


def fresh_table() -> str:
    """A table name no other test of this session uses (one database, many stores)."""
    return f"t{next(_tables)}"


def flip(path: str, offset: int) -> None:
    """Flip one bit of the byte at ``offset`` in a file."""
    with open(path, "r+b") as f:
        f.seek(offset)
        (b,) = f.read(1)
        f.seek(offset)
        f.write(bytes([b ^ 0x40]))
