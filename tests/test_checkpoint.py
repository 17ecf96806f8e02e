"""The checkpoint API (clients/checkpoint.py) on an embedded cluster: synchronized saves of many
ranks, resharding, failures before the commit, incremental saves, retention, corruption."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients import ckpt_load
from clients.checkpoint import ARENA_BYTES, Checkpointer, Shard
from clients.ckpt_format import (
    CheckpointAbortedError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTimeoutError,
    Manifest,
    manifest_name,
    step_dir,
)
from tectonic_emu import Cluster
from tectonic_emu.client import Client

from .conftest import fresh_root
from .conftest import run_in_fresh_root as run


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "c"
    Cluster.create(path, nodes=4, encoding="r3", block_size=256 << 10)
    return path


def global_array(step: int, shape: tuple[int, ...] = (61, 7)) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(step)
    return rng.standard_normal(shape).astype(np.float32)


def rank_state(step: int, rank: int, world: int, g: np.ndarray[Any, Any]) -> dict[str, Any]:
    lo = sum(len(a) for a in np.array_split(g, world)[:rank])
    mine = np.array_split(g, world)[rank]
    return {
        "w": Shard(mine, g.shape, (lo, 0)),
        "opt": np.full(3, rank * 10 + step, dtype=np.int64),  # per rank
        "lr": np.array(0.1 * step),  # alike on every rank
        "meta": f"step {step}".encode(),
    }


async def save_all(ckpt: Checkpointer, step: int, states: list[dict[str, Any]]) -> list[Any]:
    return await asyncio.gather(*(ckpt.save(step, r, s) for r, s in enumerate(states)))


def test_256_ranks_save_three_steps_and_read_back_bit_exact(cluster_dir: Path) -> None:
    world = 256

    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=world) as ckpt:
            for step in (10, 11, 12):
                g = global_array(step, (1024, 16))
                results = await save_all(
                    ckpt, step, [rank_state(step, r, world, g) for r in range(world)]
                )
                assert {r.step for r in results} == {step}
                for rank in (0, 1, 117, 255):
                    got = await ckpt.load(rank, step)
                    want = rank_state(step, rank, world, g)
                    assert np.array_equal(got["w"].array, want["w"].array)
                    assert got["w"].offset == want["w"].offset
                    assert np.array_equal(got["opt"], want["opt"]) and got["meta"] == want["meta"]
                assert np.array_equal(await ckpt.read(step, "w"), g)
            assert await ckpt.steps() == [10, 11, 12] and await ckpt.latest() == 12

    run(cluster_dir, body)


@pytest.mark.parametrize("new_world", [2, 3, 16])
def test_save_at_8_ranks_load_at_another_world_size(cluster_dir: Path, new_world: int) -> None:
    g = global_array(1)
    cube = np.arange(5 * 4 * 3, dtype=np.int16).reshape(5, 4, 3)

    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=8) as ckpt:
            states = [rank_state(1, r, 8, g) for r in range(8)]
            for r, s in enumerate(states):  # a 3-d array cut along its second axis too
                s["cube"] = Shard(cube[:, r % 4 : r % 4 + 1], cube.shape, (0, r % 4, 0))
                del s["opt"]
            await save_all(ckpt, 1, states)
            loaded = [await ckpt.load(r, world_size=new_world) for r in range(new_world)]
            assert np.array_equal(np.concatenate([x["w"].array for x in loaded]), g)
            starts = np.cumsum([0] + [len(a) for a in np.array_split(g, new_world)])
            for r, x in enumerate(loaded):
                assert x["w"].offset == (starts[r], 0) and x["w"].global_shape == g.shape
                assert x["lr"] == np.array(0.1) and x["meta"] == b"step 1"
            assert np.array_equal(np.concatenate([x["cube"].array for x in loaded]), cube)

    run(cluster_dir, body)


def test_values_that_differ_between_ranks_do_not_load_at_another_world_size(
    cluster_dir: Path,
) -> None:
    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=4) as ckpt:
            await save_all(ckpt, 1, [rank_state(1, r, 4, global_array(1)) for r in range(4)])
            with pytest.raises(CheckpointError, match="'opt' differs between ranks"):
                await ckpt.load(0, world_size=2)
            assert (await ckpt.load(3))["opt"][0] == 31  # at the world size saved: its own
            assert (await ckpt.read(1, "opt", rank=2))[0] == 21

    run(cluster_dir, body)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_read_of_a_region_equals_indexing_the_global_array(
    cluster_dir: Path, data: st.DataObject
) -> None:
    g = global_array(7, (37, 9))
    cached = _saved_for_reads(cluster_dir, g)

    def index_1d(n: int) -> st.SearchStrategy[Any]:
        ints = st.integers(-n, n - 1)
        bound = st.none() | st.integers(-n - 2, n + 2)
        steps = st.none() | st.integers(-3, 3).filter(lambda s: s != 0)
        return ints | st.builds(slice, bound, bound, steps)

    index = (data.draw(index_1d(37)), data.draw(index_1d(9)))

    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, cached, world_size=5) as ckpt:
            assert np.array_equal(await ckpt.read(1, "w", index), g[index])

    run(cluster_dir, body)


_saved: dict[str, str] = {}


def _saved_for_reads(cluster_dir: Path, g: np.ndarray[Any, Any]) -> str:
    key = str(cluster_dir)
    if key not in _saved:

        async def body(client: Client, root: str) -> str:
            async with Checkpointer(client, root, world_size=5, part_bytes=64) as ckpt:
                await save_all(ckpt, 1, [rank_state(1, r, 5, g) for r in range(5)])
            return root

        _saved[key] = run(cluster_dir, body)
    return _saved[key]


def test_a_cancelled_rank_fails_the_step_everywhere_and_leaves_nothing(cluster_dir: Path) -> None:
    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=4, timeout=60) as ckpt:
            await save_all(ckpt, 1, [rank_state(1, r, 4, global_array(1)) for r in range(4)])
            g = global_array(2)
            doomed = asyncio.ensure_future(ckpt.save(2, 3, rank_state(2, 3, 4, g)))
            await asyncio.sleep(0)  # it has begun: it is making the step's directory
            doomed.cancel()
            others = [
                asyncio.ensure_future(ckpt.save(2, r, rank_state(2, r, 4, g))) for r in range(3)
            ]
            async with asyncio.timeout(20):  # long before the 60 s timeout
                results = await asyncio.gather(*others, return_exceptions=True)
            assert all(isinstance(r, CheckpointAbortedError) for r in results), results
            assert "abort-3" in str(results[0]) and "cancelled" in str(results[0])
            assert await ckpt.latest() == 1
            assert step_dir(2) in await client.listdir(root)  # until a later commit
            await save_all(ckpt, 3, [rank_state(3, r, 4, g) for r in range(4)])
            await ckpt.wait_cleanup()
            assert await ckpt.steps() == [1, 3]
            assert step_dir(2) not in await client.listdir(root)  # collected
            assert np.array_equal(
                (await ckpt.load(0, 1))["w"].array, np.array_split(global_array(1), 4)[0]
            )

    run(cluster_dir, body)


def test_a_rank_that_never_comes_times_the_step_out(cluster_dir: Path) -> None:
    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=4, timeout=1.0) as ckpt:
            g = global_array(1)
            results = await asyncio.gather(
                *(ckpt.save(1, r, rank_state(1, r, 4, g)) for r in (0, 1)), return_exceptions=True
            )
            assert all(isinstance(r, CheckpointTimeoutError) for r in results), results
            assert "ranks 2-3 did not finish" in str(results[0])
            assert await ckpt.latest() is None
            with pytest.raises(CheckpointNotFoundError):
                await ckpt.load(0)

    run(cluster_dir, body)


RANK_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np
    from clients.checkpoint import Checkpointer, Shard
    from tectonic_emu import Cluster

    async def main(cluster, root, rank):
        async with Cluster.open(cluster) as c:
            async with Checkpointer(c.client(), root, world_size=2, timeout=60) as ckpt:
                a = np.full((4, 3), rank, dtype=np.float64)
                r = await ckpt.save(5, rank, {"w": Shard(a, (8, 3), (4 * rank, 0))})
                print("committed", r.step, flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


def test_two_processes_complete_a_synchronized_save(cluster_dir: Path, tmp_path: Path) -> None:
    root = fresh_root()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    cwd = Path(__file__).resolve().parent.parent
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(cluster_dir), root, str(rank)],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        )
        for rank in (1, 0)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()[-2000:]
        assert out.decode().strip() == "committed 5"

    async def body(client: Client, _: str) -> None:
        ckpt = Checkpointer(client, root, world_size=2)
        assert np.array_equal(
            await ckpt.read(5, "w"), np.repeat([[0.0], [1.0]], 4, axis=0).repeat(3, axis=1)
        )

    run(cluster_dir, body)


edits = st.lists(
    st.tuples(st.sampled_from(["a", "b", "blob"]), st.integers(0, 39), st.integers(-5, 5)),
    max_size=6,
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(edits, min_size=1, max_size=4))
def test_incremental_saves_load_like_full_saves(
    cluster_dir: Path, steps: list[list[tuple[str, int, int]]]
) -> None:
    """Random edits between steps: an incremental checkpoint and a full one of every step load
    the same, and the incremental one writes no more (less when little changed)."""

    async def body(client: Client, root: str) -> None:
        full = Checkpointer(client, root + "f", world_size=2, part_bytes=40)
        inc = Checkpointer(client, root + "i", world_size=2, part_bytes=40, keep_last=2)
        state = [
            {"a": np.arange(40, dtype=np.int32) + r, "b": np.zeros((40, 2)), "blob": b"x" * 40}
            for r in range(2)
        ]
        for step, changes in enumerate([[], *steps], start=1):
            for name, row, delta in changes:
                for s in state:
                    if name == "blob":
                        s[name] = (
                            s[name][:row]
                            + bytes([(s[name][row] + delta) % 256])
                            + s[name][row + 1 :]
                        )
                    else:
                        s[name] = s[name].copy()
                        s[name][row] += delta
            a = await asyncio.gather(*(full.save(step, r, state[r]) for r in range(2)))
            b = await asyncio.gather(
                *(inc.save(step, r, state[r], incremental=True) for r in range(2))
            )
            assert sum(x.bytes_written for x in b) <= sum(x.bytes_written for x in a)
            if step > 1 and not changes:
                assert sum(x.bytes_written for x in b) == 0
            for r in range(2):
                want, got = await full.load(r, step), await inc.load(r, step)
                assert want.keys() == got.keys()
                for k in want:
                    assert np.array_equal(want[k], got[k]) if k != "blob" else want[k] == got[k]
            await inc.verify(step)  # every referenced part is still there and intact

    run(cluster_dir, body)


def test_retention_keeps_the_parts_a_kept_checkpoint_references(cluster_dir: Path) -> None:
    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=1, keep_last=1) as ckpt:
            big = np.arange(100_000, dtype=np.float64)
            # Incremental from the start: a full save records no content digests to compare.
            first = await ckpt.save(1, 0, {"big": big, "small": np.zeros(3)}, incremental=True)
            second = await ckpt.save(2, 0, {"big": big, "small": np.ones(3)}, incremental=True)
            assert second.bytes_written < first.bytes_written / 100
            await ckpt.wait_cleanup()  # retention runs behind the commit
            assert await ckpt.steps() == [2]  # step 1 is gone ...
            assert step_dir(1) in await client.listdir(root)  # ... but not its data file
            got = await ckpt.load(0)
            assert np.array_equal(got["big"], big) and np.array_equal(got["small"], np.ones(3))
            await ckpt.save(3, 0, {"big": big + 1, "small": np.ones(3)}, incremental=True)
            await ckpt.wait_cleanup()
            assert await ckpt.steps() == [3] and step_dir(1) not in await client.listdir(root)
            await ckpt.verify()

    run(cluster_dir, body)


def test_save_async_stages_a_copy_and_reports_blocked_time(cluster_dir: Path) -> None:
    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=2) as ckpt:
            arrays = [np.arange(300_000, dtype=np.float32) * (r + 1) for r in range(2)]
            want = [a.copy() for a in arrays]
            pending = [await ckpt.save_async(1, r, {"x": arrays[r]}) for r in range(2)]
            for a in arrays:
                a[:] = -1  # the caller goes on training
            results = [await p.committed for p in pending]
            for r in range(2):
                assert np.array_equal((await ckpt.load(r))["x"], want[r])
                assert results[r].blocked_s == pending[r].blocked_s <= results[r].persist_s

    run(cluster_dir, body)


def test_a_corrupt_part_is_an_error_naming_rank_name_and_step(cluster_dir: Path) -> None:
    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=2) as ckpt:
            await save_all(ckpt, 4, [{"w": np.arange(10) + r} for r in range(2)])
            path = f"{root}/{manifest_name(4)}"
            m = json.loads(await client.read_file(path))
            m["entries"][1]["parts"][0]["crc32c"] ^= 1  # rank 1's 'w' as recorded
            await client.write_file(path, json.dumps(m).encode())
            assert np.array_equal((await ckpt.load(0))["w"], np.arange(10))
            with pytest.raises(CheckpointCorruptError, match=r"step 4, rank 1, 'w'"):
                await ckpt.load(1)
            with pytest.raises(CheckpointCorruptError):
                await ckpt.verify(4)

    run(cluster_dir, body)


def test_bad_arguments_are_clear_errors(cluster_dir: Path) -> None:
    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=2, timeout=5) as ckpt:
            with pytest.raises(CheckpointError, match="rank 2 is not in"):
                await ckpt.save(1, 2, {})
            for rank in (1.0, True, "1"):  # a manifest records whole rank numbers only
                with pytest.raises(CheckpointError, match="is not in"):
                    await ckpt.save(1, rank, {})  # type: ignore[arg-type]
            with pytest.raises(CheckpointError, match="are integers"):
                Shard(np.zeros(2), (4.0,), (0,))  # type: ignore[arg-type]
            with pytest.raises(CheckpointError, match="a state value is"):
                await ckpt.save(7, 0, {"x": [1, 2]})  # (step 7 is aborted for good)
            with pytest.raises(CheckpointError, match="a step is"):
                await ckpt.save(-1, 0, {})
            await asyncio.gather(ckpt.save(2, 0, {}), ckpt.save(2, 1, {}))
            with pytest.raises(CheckpointError, match="already committed"):
                await ckpt.save(2, 0, {})
            with pytest.raises(CheckpointError, match="comes before the latest"):
                await ckpt.save(1, 0, {})
            with pytest.raises(CheckpointNotFoundError):
                await ckpt.load(0, step=99)
        with pytest.raises(CheckpointError):
            Checkpointer(client, root, world_size=0)

    run(cluster_dir, body)


def test_the_ckpt_command_lists_shows_verifies_and_removes(cluster_dir: Path) -> None:
    async def body(client: Client, root: str) -> str:
        async with Checkpointer(client, root, world_size=2) as ckpt:
            for step in (1, 2):
                await save_all(
                    ckpt, step, [rank_state(step, r, 2, global_array(step)) for r in range(2)]
                )
        return root

    root = run(cluster_dir, body)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "tectonic_emu", "ckpt", *args, "--cluster", str(cluster_dir)]
        return subprocess.run(cmd, capture_output=True, text=True)

    listed = json.loads(cli("ls", root, "--json").stdout)
    assert [c["step"] for c in listed["committed"]] == [1, 2] and listed["uncommitted"] == []
    shown = json.loads(cli("show", root, "2", "--json").stdout)
    w = next(e for e in shown["entries"] if e["name"] == "w")
    assert w["shape"] == [61, 7] and w["ranks"] == [0, 1] and w["bytes"] == 61 * 7 * 4
    ok = cli("verify", root, "2")
    assert ok.returncode == 0 and "ok" in ok.stdout
    assert cli("rm", root, "1").returncode == 0
    assert [c["step"] for c in json.loads(cli("ls", root, "--json").stdout)["committed"]] == [2]
    missing = cli("show", root, "1")
    assert missing.returncode == 1 and "step 1 is not committed" in missing.stderr
    assert "Traceback" not in missing.stderr
    for sub in ("ls", "show", "verify", "rm"):
        assert "Example:" in cli(sub, "--help").stdout


def test_bench_ckpt_runs_every_path(tmp_path: Path) -> None:
    from bench.ckpt import run_ckpt_bench

    result = asyncio.run(
        run_ckpt_bench(size=2 << 20, ranks=8, encoding="rs-6-3", directory=tmp_path, runs=1)
    )
    assert result.save_mb_s > 0 and result.writer_mb_s > 0 and result.async_mb_s > 0
    assert result.async_blocked_max_s > 0 and not any(tmp_path.iterdir())


def test_a_chunk_lost_beyond_repair_is_an_error_naming_rank_name_and_step(
    cluster_dir: Path,
) -> None:
    """Stored without redundancy (r1), the chunk holding the data file is damaged on disk:
    loading fails clearly, naming the rank, the value and the step."""
    root = fresh_root()

    async def save(client: Client) -> list[Path]:
        async with Checkpointer(client, root, world_size=2, encoding="r1") as ckpt:
            await save_all(ckpt, 3, [{"w": np.arange(1000) + 1000 * r} for r in range(2)])
            chunks = []
            for data_file in sorted((await ckpt.manifest(3)).files()):  # one per writer
                (block,) = await client.layout(f"{root}/{data_file}")
                chunks.append(Path(block.chunk_paths[0] or ""))
            return chunks

    async def load(client: Client, rank: int) -> Any:
        return await Checkpointer(client, root, world_size=2).load(rank)

    async def main(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        async with Cluster.open(cluster_dir) as cluster:
            return await fn(cluster.client(), *args)

    for chunk in asyncio.run(main(save)):
        raw = bytearray(chunk.read_bytes())
        raw[-10] ^= 0xFF
        chunk.write_bytes(raw)
    for rank in (0, 1):
        with pytest.raises(CheckpointCorruptError, match=rf"step 3, rank {rank}, 'w'"):
            asyncio.run(main(load, rank))

    async def load_many(client: Client) -> Any:
        return await Checkpointer(client, root, world_size=2).load_many([0, 1])

    with pytest.raises(CheckpointCorruptError, match=r"step 3: cannot read"):
        asyncio.run(main(load_many))


def test_checkpoints_on_a_served_cluster(tmp_path: Path) -> None:
    """The same API over node processes on TCP."""
    from tectonic_emu.served import Serving

    path = tmp_path / "c"
    Cluster.create(path, nodes=9, encoding="rs-6-3", block_size=64 << 10)
    g = global_array(9, (200, 33))
    with Serving(path, repair_interval=0):

        async def body(client: Client, root: str) -> None:
            async with Checkpointer(client, root, world_size=8) as ckpt:
                states = [rank_state(9, r, 8, g) for r in range(8)]
                for state in states:
                    del state["opt"]  # per rank: not loadable at another world size
                await save_all(ckpt, 9, states)
                assert np.array_equal(await ckpt.read(9, "w"), g)
                got = [await ckpt.load(r, world_size=3) for r in range(3)]
                assert np.array_equal(np.concatenate([x["w"].array for x in got]), g)

        async def main() -> None:
            async with Cluster.open(path) as cluster:
                await body(cluster.client(), "/served")

        asyncio.run(main())


def test_ranks_loading_at_once_read_the_manifest_once_and_a_replaced_one_is_seen(
    cluster_dir: Path,
) -> None:
    """The decoded manifest is shared by concurrent loads (4,096 ranks would otherwise decode
    it 4,096 times) and reused while its file is the same; deleted and saved again (by another
    Checkpointer), the step's new manifest is what loads see. The Checkpointer that committed
    a step keeps the manifest it wrote: its loads never read it back."""
    world = 64

    async def body(client: Client, root: str) -> None:
        reads: list[int] = []
        real = client.read_id_into

        async def counting(file_id: int, offset: int, buf: Any) -> int:
            reads.append(file_id)
            return await real(file_id, offset, buf)

        client.read_id_into = counting  # type: ignore[method-assign]
        g = global_array(1, (256, 4))
        async with Checkpointer(client, root, world_size=world) as committer:
            await save_all(committer, 1, [rank_state(1, r, world, g) for r in range(world)])
            manifest_id = (await client.stat(f"{root}/{manifest_name(1)}")).id
            assert (await committer.load(3, 1))["w"].offset == (12, 0)
            assert reads.count(manifest_id) == 0
        async with Checkpointer(client, root, world_size=world) as ckpt:
            got = await asyncio.gather(*(ckpt.load(r, 1) for r in range(world)))
            assert all(
                np.array_equal(got[r]["w"].array, rank_state(1, r, world, g)["w"].array)
                for r in range(world)
            )
            assert reads.count(manifest_id) == 1
            await ckpt.load(5, 1)
            assert reads.count(manifest_id) == 1  # the same file: one stat, no read
            async with Checkpointer(client, root, world_size=world) as other:
                await other.delete(1)
                g2 = global_array(2, (256, 4))
                await save_all(other, 1, [rank_state(2, r, world, g2) for r in range(world)])
            again = await ckpt.load(7, 1)
            assert np.array_equal(again["w"].array, rank_state(2, 7, world, g2)["w"].array)
            await ckpt.delete(1)
            with pytest.raises(CheckpointNotFoundError):
                await ckpt.load(7, 1)

    run(cluster_dir, body)


def test_loads_open_each_data_file_once_and_a_step_saved_again_reads_its_new_files(
    cluster_dir: Path,
) -> None:
    """Ranks loading a step share one reader per data file (one block-map lookup per file,
    not per read). The step deleted and saved again under the same data file names (another
    Checkpointer given the first one's writer id, the worst case), the first one's loads read
    the new files, not through the readers it held for the deleted ones."""
    world = 32

    async def body(client: Client, root: str) -> None:
        opened: list[str] = []
        real = client.reader

        async def counting(path: str) -> Any:
            opened.append(path)
            return await real(path)

        client.reader = counting  # type: ignore[method-assign]
        async with (
            Checkpointer(client, root, world_size=world) as ckpt,
            Checkpointer(client, root, world_size=world) as other,
        ):
            other._writer_id = ckpt._writer_id
            names: list[list[str]] = []
            for seed, saver in ((1, ckpt), (2, other)):
                if seed == 2:
                    await ckpt.delete(1)
                g = global_array(seed, (256, 4))
                await save_all(saver, 1, [rank_state(seed, r, world, g) for r in range(world)])
                opened.clear()
                got = await asyncio.gather(*(ckpt.load(r, 1) for r in range(world)))
                for r in range(world):
                    want = rank_state(seed, r, world, g)["w"].array
                    assert np.array_equal(got[r]["w"].array, want)
                assert opened and len(opened) == len(set(opened)), opened
                names.append(sorted(opened))
            assert names[0] == names[1]

    run(cluster_dir, body)


def test_load_many_returns_what_load_returns_for_each_rank(cluster_dir: Path) -> None:
    """Ranks loaded in one call get the values ``load`` gives each: shards, per-rank and
    alike arrays, 0-d arrays and bytes, from values cut into many parts, in the order asked
    (repeats included)."""
    world = 24

    async def body(client: Client, root: str) -> None:
        g = global_array(4, (4096, 16))
        async with Checkpointer(client, root, world_size=world, part_bytes=4096) as ckpt:
            await asyncio.gather(  # incremental: with digests, for step 5 below
                *(
                    ckpt.save(4, r, rank_state(4, r, world, g), incremental=True)
                    for r in range(world)
                )
            )
            rng = np.random.default_rng(0)
            asks = [[], [5], list(range(world)), [3, 3, 0], list(rng.permutation(world)[:9])]
            for ranks in asks:
                many = await ckpt.load_many([int(r) for r in ranks])
                one = [await ckpt.load(int(r)) for r in ranks]
                assert len(many) == len(one)
                for a, b in zip(many, one, strict=True):
                    assert a.keys() == b.keys()
                    assert a["meta"] == b["meta"] and isinstance(a["meta"], bytes)
                    for name in ("opt", "lr"):
                        assert np.array_equal(a[name], b[name]) and a[name].shape == b[name].shape
                    assert np.array_equal(a["w"].array, b["w"].array)
                    assert a["w"].global_shape == b["w"].global_shape
                    assert a["w"].offset == b["w"].offset
            with pytest.raises(CheckpointError, match="rank 24 is not in"):
                await ckpt.load_many([0, world])
            # An incremental save whose first rows changed: some values now lie partly in
            # step 4's file and partly in step 5's, or wholly in step 4's; plus an empty one.
            g5 = g.copy()
            g5[:100] += 1
            states = [
                {**rank_state(5, r, world, g5), "none": np.zeros((0, 3))} for r in range(world)
            ]
            await asyncio.gather(
                *(ckpt.save(5, r, s, incremental=True) for r, s in enumerate(states))
            )
            m5 = await ckpt.manifest(5)
            dirs = {p.file.split("/")[0] for e in m5.entries if e.rank == 0 for p in e.parts}
            assert dirs == {"step-000000000004", "step-000000000005"}
            many = await ckpt.load_many(range(world), 5)
            for r, a in enumerate(many):
                b = await ckpt.load(r, 5)
                assert np.array_equal(a["w"].array, b["w"].array)
                assert np.array_equal(a["w"].array, states[r]["w"].array)
                assert a["none"].shape == (0, 3)

    run(cluster_dir, body)


def test_bytes_values_load_through_reused_arenas_as_saved(
    cluster_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes values load jointly through arenas read into reused buffers (more arenas than
    are read at once, one value longer than an arena), as ``bytes``, in the state's order,
    beside an array sharing nothing with them; the joint load is the one that serves them
    (a defect in it is raised, not hidden by loading each rank alone)."""
    world = 3
    rng = np.random.default_rng(7)
    big = rng.bytes(ARENA_BYTES + 12345)
    states = [
        {
            **{f"b{k}": rng.bytes(int(rng.integers(1, 300_000))) for k in range(6)},
            "arr": np.arange(1000, dtype=np.int32) + r,
            "tail": b"t" * (r + 1),
        }
        for r in range(world)
    ]
    states[1]["big"] = big

    async def alone(*_: Any, **__: Any) -> Any:
        raise AssertionError("loaded rank by rank: the joint load failed")

    async def body(client: Client, root: str) -> None:
        monkeypatch.setattr(ckpt_load.Loader, "_load_one", alone)
        monkeypatch.setattr(ckpt_load, "BYTES_ARENAS_IN_FLIGHT", 2)
        async with Checkpointer(client, root, world_size=world, part_bytes=64 << 10) as ckpt:
            await save_all(ckpt, 1, states)
            got = await asyncio.gather(*(ckpt.load(r, 1) for r in range(world)))
        for want, have in zip(states, got, strict=True):
            assert list(have) == list(want)
            for name, value in want.items():
                if isinstance(value, bytes):
                    assert type(have[name]) is bytes and have[name] == value, name
                else:
                    assert np.array_equal(have[name], value)

    run(cluster_dir, body)


def test_loads_into_given_arrays_fill_them_in_place(cluster_dir: Path) -> None:
    """``into=`` values are read in place by ``load`` (alone and joined with other ranks)
    and ``load_many``, values cut into many parts included; names left out are allocated;
    a destination of the wrong kind is a CheckpointError before anything is read."""
    world = 6

    async def body(client: Client, root: str) -> None:
        g = global_array(3, (600, 8))
        states = [rank_state(3, r, world, g) for r in range(world)]
        async with Checkpointer(client, root, world_size=world, part_bytes=1024) as ckpt:
            await save_all(ckpt, 3, states)

            def places(r: int) -> dict[str, Any]:
                return {
                    "w": Shard(np.zeros_like(states[r]["w"].array), g.shape, (0, 0)),
                    "opt": np.zeros(3, dtype=np.int64),
                    "meta": bytearray(len(states[r]["meta"])),
                }

            def check(r: int, out: dict[str, Any], into: dict[str, Any]) -> None:
                assert out["w"].array is into["w"].array and out["opt"] is into["opt"]
                assert out["meta"] is into["meta"] and into["meta"] == states[r]["meta"]
                assert np.array_equal(into["w"].array, states[r]["w"].array)
                assert out["w"].offset == states[r]["w"].offset  # as saved, not as given
                assert np.array_equal(into["opt"], states[r]["opt"])
                assert np.array_equal(out["lr"], states[r]["lr"])  # not given: allocated

            alone = places(2)
            check(2, await ckpt.load(2, 3, into=alone), alone)
            intos = [places(r) for r in range(world)]
            got = await asyncio.gather(*(ckpt.load(r, 3, into=intos[r]) for r in range(world)))
            for r in range(world):
                check(r, got[r], intos[r])
            intos = [places(r) for r in (4, 1)]
            got = await ckpt.load_many([4, 1], 3, into=intos)
            for r, out, into in zip((4, 1), got, intos, strict=True):
                check(r, out, into)

            bad = [
                ({"opt": np.zeros(3, dtype=np.int32)}, "int64 array of shape \\(3,\\)"),
                ({"opt": np.zeros(4, dtype=np.int64)}, "not a int64 array of shape \\(4,\\)"),
                ({"opt": np.zeros(6, dtype=np.int64)[::2]}, "not C-contiguous"),
                ({"meta": bytes(len(states[0]["meta"]))}, "read-only"),
                ({"meta": bytearray(1)}, "not 1"),
                ({"w": [0.0] * 10}, "not list"),
            ]
            for into, message in bad:
                with pytest.raises(CheckpointError, match=message):
                    await ckpt.load(0, 3, into=into)
            with pytest.raises(CheckpointError, match="'opt' differs between ranks"):
                await ckpt.load(0, 3, world_size=3, into={"opt": np.zeros(3, dtype=np.int64)})
            with pytest.raises(CheckpointError, match=r"float32 array of shape \(200, 8\)"):
                await ckpt.load(0, 3, 3, names=["w"], into={"w": np.zeros((100, 8), np.float32)})
            with pytest.raises(CheckpointError, match="2 states for 1 ranks"):
                await ckpt.load_many([0], 3, into=[{}, {}])

    run(cluster_dir, body)


def test_a_part_whose_bytes_differ_from_the_manifest_is_named_by_load_and_load_many(
    cluster_dir: Path,
) -> None:
    """The store returns its bytes (its chunk checksums hold), but they are not what the
    manifest recorded for a part: both loads name the step, the rank and the value."""
    world = 8

    async def body(client: Client, root: str) -> None:
        g = global_array(6, (512, 8))
        async with Checkpointer(client, root, world_size=world, part_bytes=1024) as ckpt:
            await save_all(ckpt, 6, [rank_state(6, r, world, g) for r in range(world)])
            path = f"{root}/{manifest_name(6)}"
            m = Manifest.decode(await client.read_file(path), path)
            bad = [
                e._replace(parts=(*e.parts[:-1], e.parts[-1]._replace(crc32c=12345)))
                if (e.rank, e.name) == (5, "w")
                else e
                for e in m.entries
            ]
            await client.write_file(path, dataclasses.replace(m, entries=tuple(bad)).encode())
            with pytest.raises(CheckpointCorruptError, match=r"step 6, rank 5, 'w'"):
                await ckpt.load(5, 6)
            with pytest.raises(CheckpointCorruptError, match=r"step 6, rank 5, 'w'"):
                await ckpt.load_many(range(world), 6)
            assert (await ckpt.load_many([4], 6))[0]["w"].offset == (256, 0)
            # Loads asked at once are served together, but each rank gets its own answer:
            # rank 5 its error, a rank out of range its own, a rank asked twice two copies.
            asked = [*range(world), world, 3]
            got = await asyncio.gather(*(ckpt.load(r, 6) for r in asked), return_exceptions=True)
            for r, out in zip(asked, got, strict=True):
                if r == 5:
                    assert isinstance(out, CheckpointCorruptError), out
                    assert "step 6, rank 5, 'w'" in str(out)
                elif r == world:
                    assert isinstance(out, CheckpointError), out
                    assert f"rank {world} is not in" in str(out)
                else:
                    assert not isinstance(out, BaseException), out
                    assert np.array_equal(out["w"].array, rank_state(6, r, world, g)["w"].array)
            assert got[3]["w"].array is not got[-1]["w"].array
            got[3]["w"].array[:] = 0  # its own copy: the other rank 3 keeps its values
            assert np.array_equal(got[-1]["w"].array, rank_state(6, 3, world, g)["w"].array)

    run(cluster_dir, body)


def test_saves_made_at_once_are_served_together_but_answered_one_by_one(
    cluster_dir: Path,
) -> None:
    """``save`` calls of one loop iteration are staged together, yet each rank gets its own
    answer: a rank out of range or given twice its own CheckpointError (the others commit);
    a state that cannot be staged its own error, and the step aborts for the others."""
    world = 4

    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=world, timeout=30) as ckpt:
            ok = [{"x": np.arange(5) + r} for r in range(world)]
            asks = [*range(world), world, 1]
            got = await asyncio.gather(
                *(ckpt.save(1, r, ok[r % world]) for r in asks), return_exceptions=True
            )
            assert [type(g).__name__ for g in got] == ["SaveResult"] * world + [
                "CheckpointError",
                "CheckpointError",
            ]
            assert f"rank {world} is not in" in str(got[world])
            assert "rank 1 already saved step 1" in str(got[-1])
            assert all(g.bytes_total == 40 for g in got[:world])
            assert await ckpt.steps() == [1]

            bad = [ok[0], ok[1], {"x": [1, 2]}, ok[3]]
            got = await asyncio.gather(
                *(ckpt.save(2, r, bad[r]) for r in range(world)), return_exceptions=True
            )
            assert isinstance(got[2], CheckpointError) and "a state value is" in str(got[2])
            for r in (0, 1, 3):
                assert isinstance(got[r], CheckpointAbortedError), got[r]
            assert await ckpt.steps() == [1]
            assert np.array_equal((await ckpt.load(3, 1))["x"], np.arange(5) + 3)

    run(cluster_dir, body)


def test_save_many_commits_the_step_save_does(cluster_dir: Path) -> None:
    """Ranks saved in one call (mixed with ranks saving one by one) make the checkpoint
    ``save`` makes; bad input fails before anything is written, and a state that cannot be
    staged aborts the step for every rank."""
    world = 12

    async def body(client: Client, root: str) -> None:
        g = global_array(7, (600, 5))
        states = [rank_state(7, r, world, g) for r in range(world)]
        async with Checkpointer(client, root, world_size=world) as ckpt:
            with pytest.raises(CheckpointError, match="rank 12 is not in"):
                await ckpt.save_many(7, {0: states[0], 12: states[0]})
            many, *one = await asyncio.gather(
                ckpt.save_many(7, {r: states[r] for r in range(world) if r % 3}),
                *(ckpt.save(7, r, states[r]) for r in range(0, world, 3)),
            )
            assert [r.rank for r in many] == [r for r in range(world) if r % 3]
            assert all(r.bytes_written == r.bytes_total > 0 for r in [*many, *one])
            loaded = await ckpt.load_many(range(world), 7)
            for r in range(world):
                want = states[r]
                assert np.array_equal(loaded[r]["w"].array, want["w"].array)
                assert loaded[r]["meta"] == want["meta"]
            with pytest.raises(CheckpointError, match="already committed"):
                await ckpt.save_many(7, {1: states[1]})
            bad = {r: dict(states[r]) for r in range(world)}
            bad[4]["oops"] = object()
            with pytest.raises(CheckpointError, match="'oops'"):
                await ckpt.save_many(8, bad)
            with pytest.raises(CheckpointAbortedError, match="abort-4"):
                await ckpt.save(8, 0, states[0])
            assert await ckpt.steps() == [7]

    run(cluster_dir, body)
