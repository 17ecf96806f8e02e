"""Simulated ranks (clients/ranks.py): thousands in one process, collectives across
processes through the store, emulated compute and stragglers in the timelines."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from clients.dataset import read_shard, write_shards
from clients.ranks import Job, ProcessInfo, Rank, RanksTimeoutError, summarize
from tectonic_emu import Cluster
from tectonic_emu.errors import InvalidArgumentError


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ranks") / "c"
    Cluster.create(path, nodes=4, encoding="r3", block_size=64 << 10)
    return path


def test_4096_ranks_pass_ten_barriers_and_each_read_a_shard(cluster_dir: Path) -> None:
    shards = 64

    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            client = cluster.client()
            table = pa.table({"i": pa.array(range(shards * 16), pa.int64())})
            index = await write_shards(client, "/shards4096", table, rows_per_shard=16)
            assert len(index.shards) == shards
            job = Job(client, "big", ranks_per_process=4096, process=ProcessInfo(0, 1))

            async def body(rank: Rank) -> int:
                for _ in range(10):
                    await rank.barrier()
                shard = await rank.io(read_shard(client, index, rank.rank % shards))
                first = shard.column("i")[0].as_py()
                assert first == 16 * (rank.rank % shards) and shard.num_rows == 16
                return int(first)

            results = await job.run(body, concurrency=64)
            assert [r.rank for r in results] == list(range(4096))
            assert {r.value for r in results} == {16 * s for s in range(shards)}
            assert all(r.timeline.io_wait_s > 0 for r in results)

    asyncio.run(main())


PROCESS = textwrap.dedent(
    """
    import asyncio, json, sys
    from clients.ranks import Job
    from tectonic_emu import Cluster

    async def main(cluster):
        async with Cluster.open(cluster) as c:
            job = Job(c.client(), "two", ranks_per_process=16, timeout=60)

            async def body(rank):
                seen = []
                for k in range(4):
                    seen.append(await rank.all_gather(rank.rank * 100 + k))
                    await rank.barrier()
                return seen

            results = await job.run(body)
            print(json.dumps([r.value for r in results]), flush=True)

    asyncio.run(main(sys.argv[1]))
    """
)


def test_two_processes_of_16_ranks_agree_on_barriers_and_gathers(
    cluster_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "proc.py"
    script.write_text(PROCESS)
    cwd = Path(__file__).resolve().parent.parent
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(cluster_dir)],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PYTHONPATH": str(cwd), "RANK": str(p), "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
        )
        for p in (1, 0)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    gathered = []
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()[-2000:]
        gathered += json.loads(out)
    want = [[r * 100 + k for r in range(32)] for k in range(4)]
    assert len(gathered) == 32 and all(seen == want for seen in gathered)


def test_compute_jitter_and_stragglers_show_in_the_timelines(cluster_dir: Path) -> None:
    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            job = Job(cluster.client(), "slow", ranks_per_process=8, process=ProcessInfo(0, 1))

            async def body(rank: Rank) -> None:
                for _ in range(5):
                    await rank.compute()
                    await rank.barrier()

            t0 = asyncio.get_running_loop().time()
            results = await job.run(body, computation_time=0.01, jitter=0.2, stragglers={3: 5.0})
            wall = asyncio.get_running_loop().time() - t0
            slow = results[3].timeline
            fast = [r.timeline for r in results if r.rank != 3]
            assert slow.compute_s > 3 * max(t.compute_s for t in fast)
            assert min(t.barrier_wait_s for t in fast) > slow.barrier_wait_s  # they wait for it
            assert {k for k, _, _ in slow.spans} == {"compute", "barrier"}
            report = summarize(results, wall)
            assert 0 < report["au"] < 1 and report["ranks"] == 8

    asyncio.run(main())


def test_a_missing_process_times_the_collective_out(cluster_dir: Path) -> None:
    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            job = Job(
                cluster.client(), "alone", ranks_per_process=2, process=ProcessInfo(0, 2), timeout=1
            )
            with pytest.raises(RanksTimeoutError, match=r"processes \[1\] did not come"):
                await job.run(lambda rank: rank.barrier())

    asyncio.run(main())


def test_process_info_from_the_launcher_environment() -> None:
    assert ProcessInfo.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == ProcessInfo(
        3, 4, 1
    )
    assert ProcessInfo.from_env({}) == ProcessInfo(0, 1, 0)
    for bad in ({"RANK": "4", "WORLD_SIZE": "4"}, {"RANK": "x"}):
        with pytest.raises(InvalidArgumentError):
            ProcessInfo.from_env(bad)
