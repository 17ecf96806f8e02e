"""``load(..., names=[...])`` and ``into=`` at another world size (clients/ckpt_select.py): a
checkpoint holding per-rank values (RNG, data-loader state) reshards when the load names
the sharded values, straight into the caller's arrays."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.checkpoint import Checkpointer, Shard
from clients.ckpt_format import CheckpointError, CheckpointNotFoundError
from tectonic_emu import Cluster
from tectonic_emu.client import Client

from .conftest import run_in_fresh_root as run


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt-names") / "c"
    Cluster.create(path, nodes=4, encoding="r3", block_size=256 << 10)
    return path


def trainer_state(g: np.ndarray[Any, Any], world: int, rank: int) -> dict[str, Any]:
    """A trainer's state: a sharded weight, per-rank RNG and data-loader state, a shared
    learning rate and config."""
    pieces = np.array_split(g, world)
    lo = sum(len(p) for p in pieces[:rank])
    return {
        "w": Shard(pieces[rank], g.shape, (lo,) + (0,) * (g.ndim - 1)),
        "rng": np.random.default_rng(rank).integers(0, 2**32, size=4, dtype=np.uint64),
        "loader": f"rank {rank} at batch {rank * 7}".encode(),
        "lr": np.array(0.25),
        "config": b"adamw",
    }


def test_resharding_a_trainer_checkpoint_names_the_values_to_load(cluster_dir: Path) -> None:
    g = np.arange(37 * 3, dtype=np.float32).reshape(37, 3)

    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=4, part_bytes=64) as ckpt:
            await asyncio.gather(*(ckpt.save(30, r, trainer_state(g, 4, r)) for r in range(4)))
            with pytest.raises(CheckpointError, match="'loader' differs between ranks"):
                await ckpt.load(0, world_size=5)  # what every value at once still does
            got = await asyncio.gather(
                *(ckpt.load(r, world_size=5, names=["w", "lr", "config"]) for r in range(5))
            )
            for r, out in enumerate(got):
                assert out.keys() == {"w", "lr", "config"}
                assert np.array_equal(out["w"].array, np.array_split(g, 5)[r])
                assert out["lr"] == 0.25 and out["config"] == b"adamw"
            # Unknown names are a typed error naming the key, before anything is read.
            with pytest.raises(CheckpointNotFoundError, match="step 30 has no 'optim'") as e:
                await ckpt.load(0, world_size=5, names=["w", "optim"])
            assert e.value.errno == errno.ENOENT and isinstance(e.value, FileNotFoundError)
            with pytest.raises(CheckpointNotFoundError, match="'optim'"):
                await ckpt.load_many([0, 1], names=["optim"])
            with pytest.raises(CheckpointError, match="collection of names, not str"):
                await ckpt.load(0, names="w")
            # At the world size saved, names pick a rank's own values (load and load_many,
            # alone or with other ranks at once).
            own = await ckpt.load(2, names=["rng", "loader"])
            assert own.keys() == {"rng", "loader"}
            assert np.array_equal(own["rng"], trainer_state(g, 4, 2)["rng"])
            together = await asyncio.gather(*(ckpt.load(r, names=["loader"]) for r in range(4)))
            many = await ckpt.load_many([3, 1], names=["loader", "w"])
            for r in range(4):
                assert together[r] == {"loader": trainer_state(g, 4, r)["loader"]}
            for r, out in zip((3, 1), many, strict=True):
                assert out.keys() == {"loader", "w"}
                assert out["loader"] == trainer_state(g, 4, r)["loader"]
                assert np.array_equal(out["w"].array, trainer_state(g, 4, r)["w"].array)

    run(cluster_dir, body)


def test_a_named_value_a_rank_did_not_save_is_an_error_for_that_rank(cluster_dir: Path) -> None:
    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=2) as ckpt:
            await asyncio.gather(
                ckpt.save(1, 0, {"a": np.zeros(2), "only0": b"x"}),
                ckpt.save(1, 1, {"a": np.ones(2)}),
            )
            got = await asyncio.gather(
                ckpt.load(0, names=["only0"]),
                ckpt.load(1, names=["only0"]),
                return_exceptions=True,
            )
            assert got[0] == {"only0": b"x"}
            assert isinstance(got[1], CheckpointNotFoundError)
            assert "rank 1 saved no 'only0'" in str(got[1])
            assert await ckpt.load(1) == {"a": pytest.approx(np.ones(2))}  # unnamed: own only

    run(cluster_dir, body)


def test_into_at_another_world_size_is_checked_before_reading(cluster_dir: Path) -> None:
    g = np.arange(40 * 2, dtype=np.int32).reshape(40, 2)

    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=2) as ckpt:
            await asyncio.gather(*(ckpt.save(1, r, trainer_state(g, 2, r)) for r in range(2)))
            box = np.full((14, 2), -1, dtype=np.int32)  # rank 0 of 3: rows 0-13
            with pytest.raises(CheckpointError, match=r"int32 array of shape \(14, 2\)"):
                await ckpt.load(0, world_size=3, names=["w"], into={"w": np.zeros((20, 2))})
            with pytest.raises(CheckpointError, match="not C-contiguous"):
                bad = np.zeros((14, 4), dtype=np.int32)[:, ::2]
                await ckpt.load(0, world_size=3, names=["w"], into={"w": bad})
            with pytest.raises(CheckpointError, match="'loader' differs"):
                await ckpt.load(0, world_size=3, into={"w": box})
            assert (box == -1).all()  # nothing read on a refused load
            lr = np.zeros((), dtype=np.float64)
            out = await ckpt.load(0, world_size=3, names=["w", "lr"], into={"w": box, "lr": lr})
            assert out["w"].array is box and np.array_equal(box, g[:14])
            assert out["w"].offset == (0, 0) and out["lr"] is lr and lr == 0.25

    run(cluster_dir, body)


dtypes = st.sampled_from([np.float32, np.int64, np.uint8, np.float16])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(0, 60),
    cols=st.lists(st.integers(1, 4), max_size=2),
    dtype=dtypes,
    saved=st.integers(1, 5),
    new=st.integers(1, 7),
    part_bytes=st.sampled_from([16, 64, 300, 1 << 20]),
    seed=st.integers(0, 2**16),
)
def test_resharding_into_caller_arrays_matches_numpy(
    cluster_dir: Path,
    rows: int,
    cols: list[int],
    dtype: Any,
    saved: int,
    new: int,
    part_bytes: int,
    seed: int,
) -> None:
    """Saved at one world size, loaded at another straight into arrays the caller made: each
    array is returned as given and holds np.array_split's rows for its rank; the per-rank
    values left out by names= do not stop it."""
    shape = (rows, *cols)
    g = np.random.default_rng(seed).integers(0, 100, size=shape).astype(dtype)

    async def body(client: Client, root: str) -> None:
        async with Checkpointer(client, root, world_size=saved, part_bytes=part_bytes) as ckpt:
            await asyncio.gather(
                *(ckpt.save(7, r, trainer_state(g, saved, r)) for r in range(saved))
            )
            want = np.array_split(g, new)
            places = [np.full(w.shape, 7, dtype=g.dtype) for w in want]
            got = await asyncio.gather(
                *(ckpt.load(r, 7, new, names=["w"], into={"w": places[r]}) for r in range(new))
            )
            start = 0
            for r, out in enumerate(got):
                assert out.keys() == {"w"}
                assert out["w"].array is places[r]
                assert np.array_equal(places[r], want[r])
                assert out["w"].offset == (start,) + (0,) * len(cols)
                assert out["w"].global_shape == shape
                start += len(want[r])

    run(cluster_dir, body)
