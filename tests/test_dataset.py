"""Sharded Parquet datasets and ShardStream (clients/dataset.py) on an embedded cluster, and
the MLPerf Storage workloads (clients/workloads.py)."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients.dataset import (
    INDEX_NAME,
    DatasetCorruptError,
    DatasetIncompleteError,
    DatasetIndex,
    RowGroup,
    ShardInfo,
    ShardStream,
    StreamClosedError,
    generate,
    load_index,
    rank_order,
    read_shard,
    write_shards,
)
from clients.shardstream import READS_IN_FLIGHT
from clients.workloads import COSMOFLOW, RESNET50, UNET3D, WORKLOADS, workload_named
from tectonic_emu import Cluster
from tectonic_emu.chunkstore import PAYLOAD_OFFSET
from tectonic_emu.client import Client
from tectonic_emu.coding.checksum import crc32c
from tectonic_emu.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    TectonicError,
)

ROWS = 1200  # the shared dataset: 12 shards of 100 rows in row groups of 25
CHUNK = 256 << 10  # the test cluster's chunks (block size)


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "c"
    Cluster.create(path, nodes=4, encoding="r3", block_size=CHUNK)
    return path


def run(cluster_dir: Path, body: Callable[[Client], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with Cluster.open(cluster_dir) as cluster:
            return await body(cluster.client())

    return asyncio.run(main())


def table(n: int, first: int = 0) -> pa.Table:
    """Rows ``first..first+n`` of a table of assorted types; ``id`` is the row number."""
    ids = np.arange(first, first + n, dtype=np.int64)
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("x", pa.float32()),
            ("name", pa.string()),
            ("blob", pa.binary()),
            ("tags", pa.list_(pa.int16())),
            ("when", pa.timestamp("ms")),
        ],
        metadata={b"origin": b"test"},
    )
    return pa.table(
        [
            ids,
            (ids * 0.5).astype(np.float32),
            [f"row {i}" for i in ids],
            [bytes([i % 251]) * (i % 37) for i in ids],
            [list(range(i % 5)) for i in ids],
            ids * 1000,
        ],
        schema=schema,
    )


@pytest.fixture(scope="module")
def dataset(cluster_dir: Path) -> DatasetIndex:
    async def body(client: Client) -> DatasetIndex:
        return await write_shards(
            client, "/shared", table(ROWS), rows_per_shard=100, row_group_rows=25
        )

    index: DatasetIndex = run(cluster_dir, body)
    return index


# -- writing -----------------------------------------------------------------------------------
def test_a_table_round_trips_and_pyarrow_skips_the_index(cluster_dir: Path, tmp_path: Path) -> None:
    data = table(1000)

    async def body(client: Client) -> tuple[DatasetIndex, dict[str, bytes], list[pa.Table]]:
        index = await write_shards(client, "/t/rt", data, rows_per_shard=300, row_group_rows=70)
        files = {n: await client.read(f"/t/rt/{n}") for n in await client.listdir("/t/rt")}
        shards = [await read_shard(client, index, i) for i in range(len(index.shards))]
        assert (await load_index(client, "/t/rt")).to_json() == index.to_json()
        return index, files, shards

    index, files, shards = run(cluster_dir, body)
    assert [s.rows for s in index.shards] == [300, 300, 300, 100]
    assert (
        pa.concat_tables(shards).equals(data) and shards[0].schema.metadata == data.schema.metadata
    )
    doc = json.loads(files[INDEX_NAME])
    assert doc["rows"] == 1000 and doc["bytes"] == sum(
        len(b) for n, b in files.items() if n != INDEX_NAME
    )
    assert [c["name"] for c in doc["columns"]] == data.column_names
    for shard in doc["shards"]:
        raw = files[shard["name"]]
        assert shard["bytes"] == len(raw) and shard["crc32c"] == crc32c(raw)
        assert sum(g[0] for g in shard["row_groups"]) == shard["rows"]
        assert all(g[0] <= 70 for g in shard["row_groups"])
        for _, offset, length, crc in shard["row_groups"]:
            assert crc == crc32c(raw[offset : offset + length])
    # pyarrow reading the directory skips _index.json (leading underscore) and gets the data.
    local = tmp_path / "rt"
    local.mkdir()
    for name, raw in files.items():
        (local / name).write_bytes(raw)
    assert pq.read_table(local).sort_by("id").equals(data)


def test_record_batches_are_cut_into_shards_of_exactly_rows_per_shard(cluster_dir: Path) -> None:
    data = table(1000)
    seen: list[int] = []

    def batches() -> Iterator[pa.RecordBatch]:
        yield from data.to_batches(max_chunksize=37)

    async def body(client: Client) -> tuple[DatasetIndex, list[pa.Table]]:
        index = await write_shards(
            client, "/t/rb", batches(), rows_per_shard=128, progress=seen.append
        )
        return index, [await read_shard(client, index, s.name) for s in index.shards]

    index, shards = run(cluster_dir, body)
    assert [s.rows for s in index.shards] == [128] * 7 + [104]
    assert pa.concat_tables(shards).equals(data)
    assert sum(seen) == index.nbytes and len(seen) == 8


def test_overwrite_rules_and_bad_input(cluster_dir: Path) -> None:
    async def body(client: Client) -> None:
        await write_shards(client, "/t/ow", table(500), rows_per_shard=100)
        with pytest.raises(AlreadyExistsError):
            await write_shards(client, "/t/ow", table(10), rows_per_shard=100)
        index = await write_shards(client, "/t/ow", table(150), rows_per_shard=100, overwrite=True)
        assert await client.listdir("/t/ow") == [
            INDEX_NAME,
            "part-00000.parquet",
            "part-00001.parquet",
        ]
        assert index.rows == 150
        other = table(10).drop_columns(["tags"]).to_batches()
        with pytest.raises(InvalidArgumentError, match="schema"):
            await write_shards(
                client, "/t/bad", [*table(10).to_batches(), *other], rows_per_shard=5
            )
        with pytest.raises(InvalidArgumentError):
            await write_shards(client, "/t/bad2", iter([]), rows_per_shard=5)
        with pytest.raises(InvalidArgumentError):
            await write_shards(client, "/t/bad3", table(10), rows_per_shard=0)
        empty = await write_shards(client, "/t/empty", table(0), rows_per_shard=5)
        assert empty.rows == 0 and empty.shards == ()
        async with ShardStream(
            client, "/t/empty", rank=0, world_size=3, batch_size=2, seed=0, epoch=0
        ) as stream:
            assert [b async for b in stream] == []

    run(cluster_dir, body)


def test_a_dataset_without_its_index_is_incomplete(cluster_dir: Path) -> None:
    async def body(client: Client) -> None:
        await write_shards(client, "/t/inc", table(100), rows_per_shard=50)
        await client.delete(f"/t/inc/{INDEX_NAME}")
        with pytest.raises(DatasetIncompleteError, match="incomplete"):
            await load_index(client, "/t/inc")
        stream = ShardStream(client, "/t/inc", rank=0, world_size=1, batch_size=4, seed=0, epoch=0)
        with pytest.raises(DatasetIncompleteError):
            await anext(stream)
        with pytest.raises(NotFoundError):
            await load_index(client, "/t/nothing-here")

    run(cluster_dir, body)


# -- sampling ----------------------------------------------------------------------------------
async def epoch(
    client: Client,
    world: int,
    *,
    seed: int,
    epoch: int,
    batch: int = 8,
    prefetch: int = 2,
    window: int | None = None,
) -> list[list[int]]:
    """Every rank's ids in the order its stream yields them, all ranks at once."""

    async def one(rank: int) -> list[int]:
        async with ShardStream(
            client,
            "/shared",
            rank=rank,
            world_size=world,
            batch_size=batch,
            seed=seed,
            epoch=epoch,
            prefetch=prefetch,
            shuffle_rows=window,
        ) as stream:
            batches = [b async for b in stream]
        assert all(b.num_rows == batch for b in batches[:-1]) and len(batches) == len(stream)
        assert all(b.schema.equals(stream.index.schema) for b in batches)  # type: ignore[union-attr]
        return [i for b in batches for i in b.column("id").to_pylist()]

    return list(await asyncio.gather(*(one(r) for r in range(world))))


@pytest.mark.parametrize("world", [1, 7, 64])
def test_every_epoch_is_the_dataset_exactly_once_in_a_seeded_order(
    cluster_dir: Path, dataset: DatasetIndex, world: int
) -> None:
    async def body(client: Client) -> None:
        first = await epoch(client, world, seed=5, epoch=0)
        again = await epoch(client, world, seed=5, epoch=0, prefetch=0)
        second = await epoch(client, world, seed=5, epoch=1)
        other_seed = await epoch(client, world, seed=6, epoch=0)
        windowed = await epoch(client, world, seed=5, epoch=0, batch=3, window=50)
        for ranks in (first, second, other_seed, windowed):
            assert sorted(i for r in ranks for i in r) == list(range(ROWS))  # exactly once
            assert max(map(len, ranks)) - min(map(len, ranks)) <= 1  # balanced
        assert again == first  # same seed and epoch: same order (prefetch or not)
        for r, ids in enumerate(first):
            assert ids == rank_order(dataset, rank=r, world_size=world, seed=5, epoch=0).tolist()
            assert (
                windowed[r]
                == rank_order(
                    dataset, rank=r, world_size=world, seed=5, epoch=0, shuffle_rows=50
                ).tolist()
            )
        assert second != first and other_seed != first
        if world == 1:  # a real shuffle: far from the stored order, and no fixed window
            assert sum(a == b for a, b in zip(first[0], second[0], strict=True)) < ROWS // 20
            assert first[0] != sorted(first[0])

    run(cluster_dir, body)


@pytest.mark.parametrize(("world", "batch", "window"), [(1, 16, 30), (7, 4, 10), (64, 2, 5)])
def test_resume_from_every_10th_batch_yields_exactly_the_rest(
    cluster_dir: Path, dataset: DatasetIndex, world: int, batch: int, window: int
) -> None:
    """Windows of the shuffle buffer that are not multiples of the batch: resumes land
    inside them."""
    args: dict[str, Any] = {"world_size": world, "batch_size": batch, "seed": 11, "epoch": 3}
    args["shuffle_rows"] = window

    async def body(client: Client) -> None:
        for rank in range(0, world, max(1, world // 8)):  # 64 ranks: every 8th
            states, batches = [], []
            async with ShardStream(client, "/shared", rank=rank, **args) as stream:
                states.append(json.loads(json.dumps(stream.state_dict())))
                async for b in stream:
                    batches.append(b)
                    states.append(json.loads(json.dumps(stream.state_dict())))
            assert len(batches) >= 9
            for k in range(0, len(batches) + 1, 10):
                async with ShardStream(
                    client, "/shared", rank=rank, state=states[k], prefetch=k % 3, **args
                ) as resumed:
                    rest = [b async for b in resumed]
                assert len(rest) == len(batches) - k
                assert all(a.equals(b) for a, b in zip(rest, batches[k:], strict=True))

    run(cluster_dir, body)


def test_a_state_of_another_stream_is_refused(cluster_dir: Path, dataset: DatasetIndex) -> None:
    async def body(client: Client) -> None:
        args: dict[str, Any] = {"world_size": 4, "batch_size": 8, "seed": 1, "epoch": 0}
        async with ShardStream(client, "/shared", rank=1, **args) as stream:
            await anext(stream)
            state = stream.state_dict()
        with pytest.raises(StreamClosedError):
            await anext(stream)
        with pytest.raises(InvalidArgumentError, match="state"):
            ShardStream(client, "/shared", rank=2, state=state, **args)
        with pytest.raises(InvalidArgumentError, match="state"):
            ShardStream(client, "/shared", rank=1, state=state, **{**args, "epoch": 1})
        await write_shards(client, "/t/other", table(10), rows_per_shard=5)
        with pytest.raises(InvalidArgumentError, match="another dataset"):
            await ShardStream(client, "/t/other", rank=1, state=state, **args).open()
        for bad in ({"rank": 4}, {"batch_size": 0}, {"seed": -1}, {"prefetch": -1}):
            with pytest.raises(InvalidArgumentError):
                ShardStream(client, "/shared", **{"rank": 0, **args, **bad})

    run(cluster_dir, body)


@st.composite
def layouts(draw: st.DrawFn) -> DatasetIndex:
    """An index (no data behind it) of random shard and row-group sizes."""
    shards = []
    for s in range(draw(st.integers(0, 6))):
        groups = draw(st.lists(st.integers(1, 40), min_size=1, max_size=5))
        rgs = tuple(RowGroup(n, 0, 0, 0) for n in groups)
        size = draw(st.integers(1, 1 << 30))  # sizes the default shuffle window
        shards.append(ShardInfo(f"part-{s:05d}.parquet", sum(groups), size, 0, 0, 0, rgs))
    return DatasetIndex("/x", pa.schema([("id", pa.int64())]), tuple(shards))


@given(
    layouts(),
    st.integers(1, 70),
    st.integers(0, 2**32),
    st.integers(0, 100),
    st.one_of(st.none(), st.integers(1, 50)),
)
def test_any_layout_and_world_size_cover_each_sample_once(
    index: DatasetIndex, world: int, seed: int, ep: int, window: int | None
) -> None:
    orders = [
        rank_order(index, rank=r, world_size=world, seed=seed, epoch=ep, shuffle_rows=window)
        for r in range(world)
    ]
    assert sorted(np.concatenate(orders).tolist()) == list(range(index.rows))
    assert max(map(len, orders)) - min(map(len, orders)) <= 1


# -- prefetch, bounded reads -------------------------------------------------------------------
class SlowClient(Client):
    """Every read takes 20 ms more, like a far device; counts reads in flight."""

    delay = 0.02

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster)
        self.in_flight = self.most_in_flight = 0

    async def read(self, path: str, offset: int = 0, size: int = -1) -> bytes:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            return await super().read(path, offset, size)
        finally:
            self.in_flight -= 1


def test_prefetch_hides_the_reads_from_a_consumer_that_computes(cluster_dir: Path) -> None:
    """A consumer computing 50 ms per batch of a store answering in 20+ ms: without prefetch it
    waits for every batch's read; with prefetch the next batch is ready when it comes back."""

    async def consume(client: Client, prefetch: int) -> list[float]:
        waits = []
        async with ShardStream(
            client,
            "/t/pf",
            rank=0,
            world_size=1,
            batch_size=16,
            seed=0,
            epoch=0,
            prefetch=prefetch,
            shuffle_rows=16,
        ) as stream:
            while True:
                start = asyncio.get_running_loop().time()
                try:
                    await anext(stream)
                except StopAsyncIteration:
                    break
                waits.append(asyncio.get_running_loop().time() - start)
                await asyncio.sleep(0.05)  # the emulated accelerator's step
        return waits

    async def main() -> tuple[list[float], list[float]]:
        async with Cluster.open(cluster_dir) as cluster:
            await write_shards(cluster.client(), "/t/pf", table(192), rows_per_shard=16)
            return await consume(SlowClient(cluster), 0), await consume(SlowClient(cluster), 2)

    without, with_ = asyncio.run(main())
    assert len(without) == len(with_) == 12
    assert min(without) >= SlowClient.delay  # every batch waited for its row group
    # After the first batch, the prefetched ones are (nearly) always waiting for the consumer.
    assert sum(with_[1:]) < 0.25 * sum(without[1:])
    assert sorted(with_[1:])[len(with_) // 2] < SlowClient.delay / 2


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_cancelled_batch_closes_the_stream_and_its_state_resumes(
    cluster_dir: Path, dataset: DatasetIndex, prefetch: int
) -> None:
    """A consumer that gives up waiting (a timeout) closes the stream; its state_dict, taken
    after the last batch it got, resumes exactly there."""
    args: dict[str, Any] = {"world_size": 2, "batch_size": 10, "seed": 4, "epoch": 0}
    args["shuffle_rows"] = 20  # windows of two batches: reads go on all epoch long

    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            client = SlowClient(cluster)
            stream = ShardStream(client, "/shared", rank=1, prefetch=prefetch, **args)
            got = [await anext(stream) for _ in range(3)]
            client.delay = 1.0
            with pytest.raises(TimeoutError):
                while True:  # the prefetched batches, then a read that takes too long
                    got.append(await asyncio.wait_for(anext(stream), 0.25))
            with pytest.raises(StreamClosedError):
                await anext(stream)
            client.delay = 0.0
            async with ShardStream(
                client, "/shared", rank=1, state=stream.state_dict(), **args
            ) as resumed:
                got += [b async for b in resumed]
        ids = [i for b in got for i in b.column("id").to_pylist()]
        want = rank_order(dataset, rank=1, seed=4, epoch=0, world_size=2, shuffle_rows=20)
        assert ids == want.tolist()

    asyncio.run(main())


def test_a_thousand_streams_share_a_bound_on_reads(
    cluster_dir: Path, dataset: DatasetIndex
) -> None:
    world = 1024

    async def main() -> tuple[list[int], int]:
        async with Cluster.open(cluster_dir) as cluster:
            client = SlowClient(cluster)
            client.delay = 0.001

            async def one(rank: int) -> list[int]:
                async with ShardStream(
                    client, "/shared", rank=rank, world_size=world, batch_size=4, seed=2, epoch=0
                ) as stream:
                    return [i async for b in stream for i in b.column("id").to_pylist()]

            ids = await asyncio.gather(*(one(r) for r in range(world)))
            return [i for r in ids for i in r], client.most_in_flight

    ids, most = asyncio.run(main())
    assert sorted(ids) == list(range(ROWS))
    assert most <= READS_IN_FLIGHT + 1  # + the index reads, which are not gated


# -- damage ------------------------------------------------------------------------------------
def test_a_damaged_chunk_is_an_error_never_wrong_data(cluster_dir: Path) -> None:
    """Stored without redundancy (r1), a chunk of a shard is damaged on disk: reading fails
    with a typed EIO error; every batch handed out before it is right."""
    data = table(400)

    async def save(client: Client) -> str:
        await client.mkdir("/t/r1", parents=True)
        await write_shards(
            client, "/t/r1/ds", data, rows_per_shard=100, row_group_rows=25, encoding="r1"
        )
        (block, *_) = await client.layout("/t/r1/ds/part-00002.parquet")
        return block.chunk_paths[0] or ""

    chunk = Path(run(cluster_dir, save))
    raw = bytearray(chunk.read_bytes())
    raw[PAYLOAD_OFFSET + (len(raw) - PAYLOAD_OFFSET) // 2] ^= 0xFF  # mid-payload
    chunk.write_bytes(raw)

    async def load(client: Client) -> None:
        index = await load_index(client, "/t/r1/ds")
        with pytest.raises(TectonicError) as caught:
            await read_shard(client, index, 2)
        assert caught.value.errno == 5  # EIO
        stream = ShardStream(
            client, "/t/r1/ds", rank=0, world_size=1, batch_size=10, seed=0, epoch=0
        )
        handed_out = 0
        with pytest.raises(TectonicError):
            async for batch in stream:
                ids = batch.column("id").to_pylist()
                assert batch.equals(data.take(ids).combine_chunks().to_batches()[0])
                handed_out += len(ids)
        assert handed_out < 400
        with pytest.raises(StreamClosedError):
            await anext(stream)
        await stream.aclose()

    run(cluster_dir, load)


def blobs(n: int, size: int = 4096) -> pa.Table:
    """``n`` rows of ``size`` random bytes each, ``id`` the row number."""
    rng = np.random.default_rng(n)
    return pa.table({"id": np.arange(n), "blob": [rng.bytes(size) for _ in range(n)]})


@pytest.mark.parametrize("big", [False, True], ids=["small-shard", "large-shard"])
def test_a_shard_changed_behind_the_index_fails_its_crc(cluster_dir: Path, big: bool) -> None:
    """Bytes of a row group changed in a file the store holds as valid: the whole-shard CRC
    (small shards, read whole) or the row group's (large ones, read by chunks) catches it."""
    path = f"/t/swap-{big}"

    async def body(client: Client) -> None:
        data = blobs(400) if big else table(200)
        per = 200 if big else 100
        index = await write_shards(client, path, data, rows_per_shard=per, row_group_rows=20)
        assert (index.shards[1].bytes > 2 * CHUNK) == big
        name = index.shards[1].name
        raw = bytearray(await client.read(f"{path}/{name}"))
        rg = index.shards[1].row_groups[3]
        raw[rg.offset + rg.length - 3] ^= 0x01  # still a valid Parquet file, wrong data
        await client.write_file(f"{path}/{name}", raw)
        with pytest.raises(DatasetCorruptError, match=f"{name}: CRC32C mismatch"):
            await read_shard(client, index, 1)
        where = f"{name} row group 3" if big else name
        with pytest.raises(DatasetCorruptError, match=f"{where}: CRC32C mismatch"):
            async with ShardStream(
                client, path, rank=0, world_size=1, batch_size=8, seed=0, epoch=0
            ) as stream:
                async for _ in stream:
                    pass

    run(cluster_dir, body)


class RecordingClient(Client):
    """Notes the chunks of the store every read touches."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster)
        self.touched: list[tuple[str, int]] = []

    def note(self, path: str, offset: int, size: int) -> None:
        chunk = self.config.block_size
        self.touched += [
            (path, c) for c in range(offset // chunk, (offset + size - 1) // chunk + 1)
        ]

    async def read(self, path: str, offset: int = 0, size: int = -1) -> bytes:
        data = await super().read(path, offset, size)
        self.note(path, offset, len(data))
        return data

    async def read_into(self, path: str, offset: int, buf: Any) -> int:
        got = await super().read_into(path, offset, buf)
        self.note(path, offset, got)
        return got


@pytest.mark.parametrize("world", [1, 3])
def test_a_stream_reads_each_chunk_of_its_share_once(cluster_dir: Path, world: int) -> None:
    """Large shards are read front to back in whole chunks: every chunk once, plus the
    footer's per shard (and a chunk at each boundary between two ranks' shares)."""

    async def main() -> tuple[DatasetIndex, list[tuple[str, int]], int]:
        async with Cluster.open(cluster_dir) as cluster:
            client = RecordingClient(cluster)
            if not await client.exists("/t/chunks"):
                await write_shards(client, "/t/chunks", blobs(1200), rows_per_shard=400)
            client.touched.clear()
            ids = await epoch_of(client, "/t/chunks", world)
            assert sorted(ids) == list(range(1200))
            index = await load_index(client, "/t/chunks")
            return index, client.touched, sum(-(-s.bytes // CHUNK) for s in index.shards)

    index, touched, chunks = asyncio.run(main())
    data = [t for t in touched if not t[0].endswith(INDEX_NAME)]
    assert len(set(data)) == chunks  # all of them
    assert len(data) <= chunks + len(index.shards) + 2 * (world - 1)


async def epoch_of(client: Client, path: str, world: int) -> list[int]:
    async def one(rank: int) -> list[int]:
        async with ShardStream(
            client, path, rank=rank, world_size=world, batch_size=32, seed=1, epoch=0
        ) as stream:
            return [i async for b in stream for i in b.column("id").to_pylist()]

    return [i for ids in await asyncio.gather(*(one(r) for r in range(world))) for i in ids]


# -- synthetic workloads -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "scale"), [("unet3d", 0.02), ("resnet50", 0.001), ("cosmoflow", 0.001)]
)
def test_generate_writes_the_scaled_workload(cluster_dir: Path, name: str, scale: float) -> None:
    sized = workload_named(name).scaled(scale)
    stored: list[int] = []

    async def body(client: Client) -> tuple[DatasetIndex, pa.Table]:
        index = await generate(client, name, scale, f"/gen/{name}", progress=stored.append)
        return index, pa.concat_tables(
            [await read_shard(client, index, i) for i in range(len(index.shards))]
        )

    index, data = run(cluster_dir, body)
    assert index.rows == sized.samples == data.num_rows
    assert data.column_names == ["index", "label", "payload"]
    assert data.column("index").to_pylist() == list(range(sized.samples))
    assert set(pa.compute.binary_length(data.column("payload")).to_pylist()) == {sized.record_bytes}
    assert (
        index.metadata["record_bytes"] == sized.record_bytes and index.metadata["workload"] == name
    )
    assert sum(stored) == index.nbytes
    payload = b"".join(data.column("payload").to_pylist()[:64])
    assert len(zlib.compress(payload)) > 0.99 * len(payload)  # random: compression cannot cheat


def test_workloads_carry_the_published_figures() -> None:
    assert set(WORKLOADS) == {"unet3d", "resnet50", "cosmoflow"}
    assert (UNET3D.samples, UNET3D.record_bytes, UNET3D.au_threshold) == (168, 146_600_628, 0.90)
    assert RESNET50.samples == 1024 * 1251 and RESNET50.accelerator("H100").batch_size == 400
    assert (
        COSMOFLOW.au_threshold == 0.70 and COSMOFLOW.accelerator("a100").computation_time == 0.00551
    )
    sized = UNET3D.scaled(0.01)
    assert (sized.record_bytes, sized.samples) == (1_466_006, 2)
    assert sized.steps_per_epoch("h100", 1) == 1
    assert sized.demand_bytes_per_s("h100") == pytest.approx(7 * 1_466_006 / 0.323)
    with pytest.raises(InvalidArgumentError):
        UNET3D.accelerator("v100")
    with pytest.raises(InvalidArgumentError):
        UNET3D.scaled(0)
    with pytest.raises(InvalidArgumentError):
        workload_named("bert")
