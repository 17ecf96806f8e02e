"""``bench train``: a tiny run closes every cluster it opened (fsspec's own among them)."""

from __future__ import annotations

import asyncio
import gc
import threading
from pathlib import Path

from bench.train import run_train_bench


def _cluster_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("tectonic-io")}


def test_a_run_leaves_no_cluster_open(tmp_path: Path) -> None:
    """fsspec's filesystem opens a cluster of its own; left open, it was closed only at
    interpreter exit, which asyncio reported as an error ("aclose(): asynchronous
    generator is already running")."""
    before = _cluster_threads()
    leftover: list[object] = []

    async def main() -> None:
        await run_train_bench(directory=tmp_path, samples=40, epochs=1, sources=("fsspec",))
        gc.collect()  # the loop knows the generators begun on it until they are collected
        loop = asyncio.get_running_loop()
        leftover.extend(g for g in loop._asyncgens if g.__qualname__.startswith("Cluster."))  # type: ignore[attr-defined]

    asyncio.run(main())
    assert leftover == []
    assert _cluster_threads() <= before
