"""The torch DCP storage plugin (``clients/torch_dcp.py``): save/load round trips, loads that
read only the bytes they need, the atomic commit, a save from two gloo processes, and the
checkpoint ids it accepts."""

from __future__ import annotations

import asyncio
import errno
import io
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("torch")

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from clients.torch_dcp import (
    METADATA_NAME,
    CheckpointCorruptError,
    TectonicStorageReader,
    TectonicStorageWriter,
    box_range,
    store_path,
)
from tectonic_emu import (
    AlreadyExistsError,
    Client,
    Cluster,
    InvalidPathError,
    NotEnoughNodesError,
    NotFoundError,
    Stat,
)
from tectonic_emu.reader import FileReader

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
BLOCK = 64 << 10

# dcp warns on every no_dist call that torch.distributed is not initialised.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    root = tmp_path / "cluster"
    Cluster.create(root, nodes=4, encoding="r3", block_size=BLOCK)
    return root


def in_store(root: Path, fn: Callable[[Cluster], Coroutine[Any, Any, T]]) -> T:
    async def go() -> T:
        async with Cluster.open(root) as c:
            return await fn(c)

    return asyncio.run(go())


def listdir(root: Path, path: str) -> list[str]:
    return in_store(root, lambda c: c.client().listdir(path))


def stat(root: Path, path: str) -> Stat:
    return in_store(root, lambda c: c.client().stat(path))


def write_file(root: Path, path: str, data: bytes) -> None:
    in_store(root, lambda c: c.client().write_file(path, data))


def save(root: Path, ckpt: str, state: dict[str, Any], **kw: Any) -> None:
    with TectonicStorageWriter(root, ckpt, **kw) as writer:
        dcp_save(state, storage_writer=writer, no_dist=True)


def load(root: Path, ckpt: str, state: dict[str, Any]) -> None:
    with TectonicStorageReader(root, ckpt) as reader:
        dcp_load(state, storage_reader=reader, no_dist=True)


def failure(exc: pytest.ExceptionInfo[CheckpointException]) -> BaseException:
    """The error rank 0 raised inside dcp (which wraps every rank's error)."""
    return exc.value.failures[0][0]


@pytest.fixture
def data_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """(path, offset, size) of every ranged read of a data file, by any storage reader."""
    reads: list[tuple[str, int, int]] = []
    real, real_reader = Client.read_into, FileReader.read_into

    async def counting(self: Client, path: str, offset: int, buf: Any) -> int:
        if path.endswith(".distcp"):
            reads.append((path, offset, memoryview(buf).nbytes))
        return await real(self, path, offset, buf)

    async def counting_reader(self: FileReader, offset: int, buf: Any) -> int:
        if (self.path or "").endswith(".distcp"):
            reads.append((self.path or "", offset, memoryview(buf).nbytes))
        return await real_reader(self, offset, buf)

    monkeypatch.setattr(Client, "read_into", counting)
    monkeypatch.setattr(FileReader, "read_into", counting_reader)
    return reads


# -- round trips ---------------------------------------------------------------------------------
def test_save_and_load_round_trip(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    Cluster.create(root, nodes=9, encoding="r3", block_size=BLOCK)
    g = torch.Generator().manual_seed(0)
    model = {
        "w": torch.randn(256, 600, generator=g),  # 600 KiB: several rs-6-3 blocks
        "half": torch.randn(33, generator=g).to(torch.bfloat16),  # odd byte counts
        "idx": torch.arange(-5, 12, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "t": torch.randn(20, 30, generator=g).t(),  # not contiguous
    }
    state = {"model": model, "step": 1234, "name": "run-7", "blob": io.BytesIO(b"\x00raw\xff")}
    with TectonicStorageWriter(root, "/ckpt/step-1", encoding="rs-6-3") as writer:
        md = dcp_save(state, storage_writer=writer, no_dist=True)
    assert md.storage_meta is not None
    assert md.storage_meta.checkpoint_id == "tectonic:///ckpt/step-1"

    names = listdir(root, "/ckpt/step-1")
    assert names[0] == METADATA_NAME and len(names) == 2 and names[1].endswith("-0.distcp")
    for name in names:  # both sealed, with the writer's encoding
        st = stat(root, f"/ckpt/step-1/{name}")
        assert (st.sealed, st.encoding) == (True, "rs-6-3")

    out: dict[str, Any] = {
        "model": {k: torch.zeros_like(v) for k, v in model.items()},
        "step": 0,
        "name": "",
        "blob": io.BytesIO(),
    }
    load(root, "tectonic:///ckpt/step-1", out)
    for k, v in model.items():
        assert out["model"][k].dtype == v.dtype
        assert torch.equal(out["model"][k], v), k
    assert (out["step"], out["name"]) == (1234, "run-7")
    assert out["blob"].getvalue() == b"\x00raw\xff"


def test_loading_some_keys_reads_only_their_bytes(
    cluster: Path, data_reads: list[tuple[str, int, int]]
) -> None:
    state = {k: torch.full((64, 1024), float(i)) for i, k in enumerate("abc")}  # 256 KiB each
    save(cluster, "/ckpt/p", state)
    [data_file] = [n for n in listdir(cluster, "/ckpt/p") if n.endswith(".distcp")]
    size = stat(cluster, f"/ckpt/p/{data_file}").size

    out = {"b": torch.zeros(64, 1024)}
    load(cluster, "/ckpt/p", out)
    assert torch.equal(out["b"], state["b"])
    assert sum(n for _, _, n in data_reads) == 256 << 10 < size
    assert all(n < size for _, _, n in data_reads)


def test_whole_tensors_are_read_straight_into_their_destinations(
    cluster: Path, data_reads: list[tuple[str, int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole tensor of at least ``direct_bytes`` with a contiguous destination of its dtype
    and shape is read into it in one read of its own (then checked: a flipped byte is still
    reported); the rest is read merged into a buffer and copied into place."""
    monkeypatch.setattr(TectonicStorageReader, "direct_bytes", 16 << 10)
    g = torch.Generator().manual_seed(1)
    state = {
        "a": torch.randn(64, 64, generator=g),  # 16 KiB: in place
        "b": torch.randn(64, 64, generator=g),  # 16 KiB, but its destination is transposed
        "c": torch.randn(8, generator=g),  # small
        "d": torch.randn(64, 64, generator=g).to(torch.float64),  # 32 KiB, a float32 dest
    }
    save(cluster, "/ckpt/in-place", state)
    out = {
        "a": torch.zeros(64, 64),
        "b": torch.zeros(64, 64).t(),
        "c": torch.zeros(8),
        "d": torch.zeros(64, 64),
    }
    load(cluster, "/ckpt/in-place", out)
    for k, v in state.items():
        assert torch.equal(out[k], v.to(out[k].dtype)), k
    sizes = sorted(n for _, _, n in data_reads)
    assert 16 << 10 in sizes  # "a" alone ("b" touches "c", and they are read merged)
    assert sum(sizes) == sum(v.nbytes for v in state.values())  # each byte read once

    [data_file] = [n for n in listdir(cluster, "/ckpt/in-place") if n.endswith(".distcp")]

    async def spoil(c: Cluster) -> None:
        path = f"/ckpt/in-place/{data_file}"
        data = bytearray(await c.client().read_file(path))
        data[: 64 << 10] = bytes(b ^ 1 for b in data[: 64 << 10])  # every tensor
        await c.client().write_file(path, data)

    in_store(cluster, spoil)
    with pytest.raises(CheckpointException) as exc:
        load(cluster, "/ckpt/in-place", {"a": torch.zeros(64, 64)})
    err = failure(exc)
    assert isinstance(err, CheckpointCorruptError) and "checksum" in str(err)


class BoxPlanner:
    """The three LoadPlanner calls read_data makes, for a hand-made LoadPlan."""

    def __init__(self, dest: Any) -> None:
        self.dest = dest
        self.committed: list[ReadItem] = []

    def resolve_tensor(self, req: ReadItem) -> Any:
        return self.dest

    def commit_tensor(self, req: ReadItem, tensor: Any) -> None:
        self.committed.append(req)

    def load_bytes(self, req: ReadItem, value: io.BytesIO) -> None:
        raise AssertionError("no bytes in this plan")


@pytest.mark.parametrize(
    ("offsets", "lengths"),
    [((3, 0), (5, 40)), ((2, 7), (4, 5)), ((0, 39), (10, 1)), ((9, 1), (1, 3)), ((4, 4), (0, 3))],
)
def test_a_resharded_box_reads_from_its_first_to_its_last_element(
    cluster: Path,
    data_reads: list[tuple[str, int, int]],
    offsets: tuple[int, int],
    lengths: tuple[int, int],
) -> None:
    # What a load into another sharding asks for: part of a saved tensor ("storage offsets").
    w = torch.arange(400, dtype=torch.float32).reshape(10, 40)
    save(cluster, "/ckpt/box", {"pad": torch.ones(3, dtype=torch.int16), "w": w})
    dest = torch.zeros(lengths)
    req = ReadItem(
        type=LoadItemType.TENSOR,
        dest_index=MetadataIndex("w"),
        dest_offsets=torch.Size([0, 0]),
        storage_index=MetadataIndex("w", [0, 0]),
        storage_offsets=torch.Size(offsets),
        lengths=torch.Size(lengths),
    )
    planner = BoxPlanner(dest)
    with TectonicStorageReader(cluster, "/ckpt/box") as reader:
        reader.set_up_storage_reader(reader.read_metadata(), True)
        reader.read_data(LoadPlan([req]), planner).wait()  # type: ignore[arg-type]
    (r0, c0), (nr, nc) = offsets, lengths
    assert torch.equal(dest, w[r0 : r0 + nr, c0 : c0 + nc])
    assert planner.committed == [req]
    first, end, _ = box_range((10, 40), offsets, lengths, 4)
    assert sum(n for _, _, n in data_reads) == end - first


def test_box_range() -> None:
    assert box_range((10, 40), (3, 0), (5, 40), 4) == (3 * 160, 8 * 160, (40, 1))  # whole rows
    assert box_range((10, 40), (2, 7), (4, 5), 2) == ((2 * 40 + 7) * 2, (5 * 40 + 12) * 2, (40, 1))
    assert box_range((), (), (), 8) == (0, 8, ())
    assert box_range((2, 3, 4), (1, 0, 0), (0, 3, 4), 4) == (0, 0, (12, 4, 1))
    for offsets, lengths in [((0, 0), (11, 40)), ((0, -1), (1, 1)), ((0,), (1,))]:
        with pytest.raises(ValueError, match="outside"):
            box_range((10, 40), offsets, lengths, 4)


# -- the commit --------------------------------------------------------------------------------
def test_a_failed_save_commits_nothing_and_leaves_others_alone(cluster: Path) -> None:
    good = {"w": torch.arange(50_000.0)}
    save(cluster, "/ckpt/good", good)

    def set_nodes(up: bool) -> None:
        async def go(c: Cluster) -> None:
            for n in (1, 2, 3):
                c.start_node(n) if up else c.stop_node(n)

        in_store(cluster, go)

    set_nodes(False)  # r3 writes need 2 live nodes
    with pytest.raises(CheckpointException) as exc:
        save(cluster, "/ckpt/bad", {"w": torch.ones(50_000)})
    assert isinstance(failure(exc), NotEnoughNodesError)
    set_nodes(True)
    # The data file was a nameless new version, dropped on error; .metadata never written.
    assert listdir(cluster, "/ckpt/bad") == []

    with TectonicStorageReader(cluster, "/ckpt/bad") as reader:
        with pytest.raises(NotFoundError, match="no committed checkpoint") as nf:
            reader.read_metadata()
        assert nf.value.errno == errno.ENOENT
    with pytest.raises(CheckpointException, match="no committed checkpoint"):
        load(cluster, "/ckpt/bad", {"w": torch.zeros(50_000)})

    out = {"w": torch.zeros(50_000)}
    load(cluster, "/ckpt/good", out)
    assert torch.equal(out["w"], good["w"])


def test_a_commit_that_fails_at_the_rename_leaves_no_metadata(
    cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_rename(self: Client, src: str, dst: str, **kw: Any) -> None:
        raise OSError(errno.EIO, "injected")

    with monkeypatch.context() as m:
        m.setattr(Client, "rename", broken_rename)
        with pytest.raises(CheckpointException) as exc:
            save(cluster, "/ckpt/r", {"w": torch.ones(1000)})
    assert "injected" in str(failure(exc))
    # The temporary metadata is removed; the data file of the failed save stays behind.
    [leftover] = listdir(cluster, "/ckpt/r")
    assert leftover.endswith(".distcp")

    # A retry commits under new names; the leftover is not part of it.
    save(cluster, "/ckpt/r", {"w": torch.full((1000,), 2.0)})
    assert len(listdir(cluster, "/ckpt/r")) == 3
    out = {"w": torch.zeros(1000)}
    load(cluster, "/ckpt/r", out)
    assert torch.equal(out["w"], torch.full((1000,), 2.0))


def test_a_committed_checkpoint_is_not_overwritten(cluster: Path) -> None:
    save(cluster, "/ckpt/c", {"w": torch.ones(10)})
    before = listdir(cluster, "/ckpt/c")
    with pytest.raises(CheckpointException) as exc:
        save(cluster, "/ckpt/c", {"w": torch.zeros(10)})
    err = failure(exc)
    assert isinstance(err, AlreadyExistsError) and err.errno == errno.EEXIST
    assert listdir(cluster, "/ckpt/c") == before
    out = {"w": torch.zeros(10)}
    load(cluster, "/ckpt/c", out)
    assert torch.equal(out["w"], torch.ones(10))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_data_file_is_reported(cluster: Path, damage: str) -> None:
    save(cluster, "/ckpt/d", {"w": torch.arange(1000.0)})
    [data_file] = [n for n in listdir(cluster, "/ckpt/d") if n.endswith(".distcp")]

    async def spoil(c: Cluster) -> None:  # swap in other bytes under the same name
        path = f"/ckpt/d/{data_file}"
        data = bytearray(await c.client().read_file(path))
        if damage == "truncate":
            del data[-8:]
        else:
            data[100] ^= 1
        await c.client().write_file(path, data)

    in_store(cluster, spoil)
    with pytest.raises(CheckpointException) as exc:
        load(cluster, "/ckpt/d", {"w": torch.zeros(1000)})
    err = failure(exc)
    assert isinstance(err, CheckpointCorruptError) and err.errno == errno.EIO
    assert ("checksum" if damage == "flip" else "data file ends") in str(err)


def test_metadata_of_another_kind_is_reported(cluster: Path) -> None:
    in_store(cluster, lambda c: c.client().mkdir("/ckpt/m", parents=True))
    with TectonicStorageReader(cluster, "/ckpt/m") as reader:
        for blob, message in [(b"not a pickle", "unreadable"), (pickle.dumps({}), "not DCP")]:
            write_file(cluster, "/ckpt/m/.metadata", blob)
            with pytest.raises(CheckpointCorruptError, match=message):
                reader.read_metadata()


# -- checkpoint ids ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("checkpoint_id", "path"),
    [
        ("tectonic:///ckpt/step-100", "/ckpt/step-100"),
        ("/ckpt/step-100", "/ckpt/step-100"),
        ("tectonic:////ckpt//step-100/", "/ckpt/step-100"),
    ],
)
def test_accepted_checkpoint_ids(checkpoint_id: str, path: str) -> None:
    assert TectonicStorageWriter.validate_checkpoint_id(checkpoint_id)
    assert TectonicStorageReader.validate_checkpoint_id(checkpoint_id)
    assert store_path(checkpoint_id) == path


@pytest.mark.parametrize(
    "checkpoint_id",
    [
        Path("/ckpt/step-100"),  # a local directory: FileSystemWriter's
        "ckpt/step-100",
        "",
        "/",
        "tectonic://",
        "tectonic:///",
        "tectonic://host/ckpt",
        "s3://bucket/ckpt",
        "file:///ckpt",
        "/ckpt/../etc",
        "/ckpt/a\0b",
        "/ckpt/" + "x" * 256,
    ],
)
def test_rejected_checkpoint_ids(tmp_path: Path, checkpoint_id: Any) -> None:
    assert not TectonicStorageWriter.validate_checkpoint_id(checkpoint_id)
    assert not TectonicStorageReader.validate_checkpoint_id(checkpoint_id)
    with pytest.raises(InvalidPathError) as exc:
        TectonicStorageWriter(tmp_path, checkpoint_id)
    assert exc.value.errno in (errno.EINVAL, errno.ENAMETOOLONG)


def test_checkpoint_id_given_to_dcp(cluster: Path) -> None:
    writer = TectonicStorageWriter(cluster)  # no id yet
    with writer:
        dcp_save({"w": torch.ones(4)}, checkpoint_id="tectonic:///ckpt/x", storage_writer=writer)
    assert writer.checkpoint_id == "tectonic:///ckpt/x"
    # Picklable (async_save may ship it to another process); the copy reopens the cluster.
    with pickle.loads(pickle.dumps(writer)) as copy:
        dcp_save({"w": torch.ones(4)}, checkpoint_id="/ckpt/y", storage_writer=copy)
    with TectonicStorageReader(cluster) as reader:
        out = {"w": torch.zeros(4)}
        dcp_load(out, checkpoint_id="/ckpt/y", storage_reader=reader)
        assert torch.equal(out["w"], torch.ones(4))
    with TectonicStorageReader(cluster) as reader, pytest.raises(CheckpointException):
        dcp_load({"w": torch.zeros(4)}, storage_reader=reader)  # no id anywhere


# -- two gloo processes ------------------------------------------------------------------------
ROWS = torch.arange(16 * 256, dtype=torch.float32).reshape(16, 256)
COLS = torch.arange(8 * 24, dtype=torch.float64).reshape(8, 24)
SHARED = torch.arange(10 * 6, dtype=torch.int32).reshape(10, 6)
CHILD = "import sys; from tests.test_torch_dcp import gloo_rank; gloo_rank(*sys.argv[1:])"


def gloo_rank(rank_arg: str, cluster: str, rendezvous: str) -> None:
    """One of two gloo ranks (run by ``test_two_gloo_processes`` in a child process)."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    rank = int(rank_arg)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    try:
        mesh = init_device_mesh("cpu", (2,))
        # Reshard on load: "/ckpt/full" holds whole tensors; each rank loads its half.
        reads: list[int] = []
        real = FileReader.read_into

        async def counting(self: FileReader, offset: int, buf: Any) -> int:
            reads.append(memoryview(buf).nbytes)
            return await real(self, offset, buf)

        FileReader.read_into = counting  # type: ignore[method-assign]
        rows = distribute_tensor(torch.zeros_like(ROWS), mesh, [Shard(0)])
        with TectonicStorageReader(cluster, "/ckpt/full") as reader:
            dcp_load({"rows": rows}, storage_reader=reader)
        FileReader.read_into = real  # type: ignore[method-assign]
        assert torch.equal(rows.to_local(), ROWS.chunk(2, 0)[rank])
        assert sum(reads) == ROWS.nbytes // 2, reads
        cols = distribute_tensor(torch.zeros_like(COLS), mesh, [Shard(1)])
        with TectonicStorageReader(cluster, "/ckpt/full") as reader:
            dcp_load({"cols": cols}, storage_reader=reader)
        assert torch.equal(cols.to_local(), COLS.chunk(2, 1)[rank])

        # Save: keys of its own, a DTensor sharded over both ranks, and a shared int.
        state = {
            f"rank{rank}": torch.full((1000,), float(rank + 1)),
            "shared": distribute_tensor(SHARED, mesh, [Shard(0)]),
            "step": 42,
        }
        with TectonicStorageWriter(cluster, "/ckpt/two") as writer:
            dcp_save(state, storage_writer=writer)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes(cluster: Path, tmp_path: Path) -> None:
    save(cluster, "/ckpt/full", {"rows": ROWS, "cols": COLS})
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = [str(cluster), str(tmp_path / "rendezvous")]
    logs = [tmp_path / f"rank{rank}.log" for rank in range(2)]
    procs = []
    for rank, log in enumerate(logs):
        with log.open("wb") as sink:  # a file, not a pipe: a chatty rank never blocks
            cmd = [sys.executable, "-c", CHILD, str(rank), *args]
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=sink))
    try:
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:  # a rank that failed can leave the other waiting: never hang
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {rank} failed:\n{log.read_text(errors='replace')}"

    names = listdir(cluster, "/ckpt/two")
    assert names[0] == METADATA_NAME
    assert sorted(n[-9:] for n in names[1:]) == ["-0.distcp", "-1.distcp"]
    out: dict[str, Any] = {
        "rank0": torch.zeros(1000),
        "rank1": torch.zeros(1000),
        "shared": torch.zeros_like(SHARED),
        "step": 0,
    }
    load(cluster, "/ckpt/two", out)
    assert torch.equal(out["rank0"], torch.full((1000,), 1.0))
    assert torch.equal(out["rank1"], torch.full((1000,), 2.0))
    assert torch.equal(out["shared"], SHARED)
    assert out["step"] == 42
