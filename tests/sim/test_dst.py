"""Deterministic simulation testing (``clients/dst``, issue 24): seeded fault schedules
over a whole model cluster, the real client, data path and repair in virtual time."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import struct
from typing import Any

import pytest
from click.testing import CliRunner

from clients.dst import faults, run_seed, run_seeds
from clients.dst import run as dst_run
from clients.projection import PRESETS, model_cluster
from tectonic_emu import buggify, clock
from tectonic_emu.cli import cli as cli_main
from tectonic_emu.errors import DataUnavailableError
from tectonic_emu.metadata.layers import disk_prefix

# Seeds per CI run, 1,000 in all (about 2 minutes here): each workload from its own
# thousand, so that each meets schedules of its own.
SEEDS = {"files": (0, 350), "checkpoint": (1000, 300), "stream": (3000, 200), "mixed": (2000, 150)}
FILE_OPS = ("put ok", "stream ok", "delete ok", "read ok", "takeover crashed", "takeover fenced")
SAVE_OPS = ("save ok", "save crashed", "save CheckpointAbortedError")


def test_a_seed_replays_exactly() -> None:
    """The same seed gives the same faults, operations, outcomes and trace, event for
    event; another seed another trace."""
    a, b = run_seed(11, "mixed"), run_seed(11, "mixed")
    assert a == b and a.trace == b.trace
    assert run_seed(12, "mixed").trace != a.trace


@pytest.mark.parametrize("workload", list(SEEDS))
def test_every_seed_holds_every_invariant(workload: str) -> None:
    """``files``: every acknowledged byte reads back, during the faults and after, a
    stalled writer is fenced. ``checkpoint``: ranks save three steps while faults fall and
    now and then a rank crashes mid-save; every step that returned is committed, a failed
    one leaves the step before it latest, every committed step loads back exactly.
    ``stream``: every rank reads exactly its samples of an epoch, in order. All:
    crashes keep what was acknowledged, repair restores full redundancy, the reverse
    index matches, no error swallowed, no task leaked."""
    first, count = SEEDS[workload]
    summary = run_seeds(first, count, workload)
    assert summary.seeds == count
    assert [(r.seed, r.violations) for r in summary.failed] == []
    assert set(summary.faults) == set(faults.KINDS)  # every kind fell somewhere
    ops = {
        "files": FILE_OPS,
        "checkpoint": SAVE_OPS,
        "stream": ("epoch ok", "epoch ConnectionResetError"),
        "mixed": (*FILE_OPS, *SAVE_OPS, "epoch ok"),
    }[workload]
    for op in ops:
        assert summary.ops[op] > 0, op


@pytest.mark.parametrize(
    ("bug", "workload", "says"),
    [
        ("ack-before-durable", "files", "durable chunks of the"),
        ("repair-deletes-good", "files", "not back to full redundancy"),
        ("manifest-before-data", "checkpoint", "partial"),
    ],
)
def test_a_planted_bug_is_caught(bug: str, workload: str, says: str) -> None:
    """Each planted bug (``tectonic_emu/buggify.py``) fails some of the first 30 seeds
    (7, 17 and 18 of them), with the violation that names it; the same seeds pass
    without it (the tests above)."""
    summary = run_seeds(0, 30, workload, planted=[bug])
    assert summary.failed, f"{bug} went unnoticed"
    assert any(says in v for r in summary.failed for v in r.violations)


def test_buggify_is_off_outside_a_simulation_run() -> None:
    assert not any(buggify.fires(1.0) for _ in range(100))
    assert not buggify.planted("ack-before-durable")
    with buggify.active(3, planted=["repair-deletes-good"]):
        assert buggify.fires(1.0) and not buggify.fires(0.0)
        assert buggify.planted("repair-deletes-good")
        assert not buggify.planted("ack-before-durable")
    assert not buggify.fires(1.0) and not buggify.planted("repair-deletes-good")
    with pytest.raises(ValueError, match="no such planted bug"), buggify.active(1, planted=["x"]):
        pass


@pytest.mark.parametrize("short_reads", [1, 2])
def test_a_chunk_that_failed_its_checksum_is_read_once_more(short_reads: int) -> None:
    """Found by seed 64 of this suite: an rs-3-2 block with a corrupt chunk and another on
    a crashed server (both within what it survives) was given up when buggify made a
    third chunk's read short. A chunk that fails its checksum is now read once more before
    its block is given up: here, of an r3 block with two corrupt copies, the third's one
    short read passes and two do not (a bad sector fails every time)."""

    async def go() -> None:
        hw = dataclasses.replace(
            PRESETS["small-flash"].hardware, servers=4, disks=1, metadata=None, cpu=None
        )
        mc, hosts = model_cluster(hw, "r3", 1 << 16, 1, 16, 1)
        client = (await mc.client_cluster(hosts[0])).client()
        data = random.Random(1).randbytes(50_000)
        await client.write_file("/f", data)
        (block,) = await client.layout("/f")
        *bad, last = block.chunks
        for c in bad:
            mc.servers[c.node].store.corrupt(c.disk, c.chunk_id)
        store = mc.servers[last.node].store
        real, left = store.read_chunk, [short_reads]

        async def short(disk: int, chunk_id: str) -> tuple[Any, Any]:
            payload, info = await real(disk, chunk_id)
            if chunk_id == last.chunk_id and left[0] > 0:
                left[0] -= 1
                payload = payload[: len(payload) // 2]
            return payload, info

        store.read_chunk = short  # type: ignore[method-assign]
        if short_reads == 1:
            assert await client.read_file("/f") == data
        else:
            with pytest.raises(DataUnavailableError):
                await client.read_file("/f")

    clock.run_virtual(go())


def test_a_reverse_index_out_of_step_is_caught() -> None:
    """The end check recounts each disk's blocks from the block records: an index entry
    gone (a transaction that forgot it) is a violation."""

    async def go() -> list[str]:
        hw = dataclasses.replace(
            PRESETS["small-flash"].hardware, servers=8, disks=2, metadata=None, cpu=None
        )
        mc, hosts = model_cluster(hw, "r3", 1 << 16, 1, 16, 1)
        client = (await mc.client_cluster(hosts[0])).client()
        await client.write_file("/f", b"x" * 1000)
        assert await dst_run._reverse_index(mc, mc.meta) == []
        (block,) = await client.layout("/f")
        c = block.chunks[0]
        async with mc.kv.transaction() as t:
            await t.delete(disk_prefix(c.node, c.disk) + struct.pack(">Q", block.block_id))
        return await dst_run._reverse_index(mc, mc.meta)

    (why,) = clock.run_virtual(go())
    assert "reverse index" in why


def test_a_stuck_seed_is_a_failure_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed whose tasks all wait on something nobody will do (found so: a metadata
    stall cancelled mid-commit kept the store's lock) blocks a virtual loop for ever; it
    is given up after ``STUCK_S`` of wall time and reported."""

    async def stuck(seed: int, workload: str) -> None:
        await asyncio.get_running_loop().create_future()

    monkeypatch.setattr(dst_run, "STUCK_S", 0.5)
    monkeypatch.setattr(dst_run, "_run", stuck)
    r = run_seed(5)
    assert len(r.violations) == 1 and r.violations[0].startswith("stuck: no end after 0.5 s")


def test_a_seed_whose_run_raises_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(seed: int, workload: str) -> None:
        raise KeyError("a bug in a check")

    monkeypatch.setattr(dst_run, "_run", broken)
    out = CliRunner().invoke(cli_main, ["simulate", "faults", "--seeds", "2", "--json"])
    assert out.exit_code == 3
    d = json.loads(out.output)
    assert [r["seed"] for r in d["failed"]] == [0, 1]
    assert d["failed"][0]["violations"] == ["the run raised KeyError: 'a bug in a check'"]


def test_the_schedule_damages_no_more_servers_than_the_encoding_tolerates() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        victims = rng.randint(0, 2)
        fs = faults.schedule(rng, servers=8, victims=victims, horizon=0.4, count=8)
        assert len({f.server for f in fs if f.kind in faults.DAMAGE}) <= victims
        assert [f.at for f in fs] == sorted(f.at for f in fs)
        assert all(0 <= f.at <= 0.4 and 0 <= f.server < 8 for f in fs)


def _beyond_tolerance(monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage on every server: more bad chunks per block than any encoding survives."""

    def everywhere(rng: random.Random, **_: object) -> list[faults.Fault]:
        at = sorted(rng.uniform(0.1, 0.4) for _ in range(100))
        return [faults.Fault(t, "lose", rng.randrange(8), pick=rng.randrange(1 << 30)) for t in at]

    monkeypatch.setattr("clients.dst.run.schedule", everywhere)


def test_lost_data_is_caught_and_its_seed_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariants can fail: with chunks lost on every server, some seed loses
    acknowledged bytes, the run says so, and its replay command fails the same way."""
    _beyond_tolerance(monkeypatch)
    failed = run_seeds(0, 10).failed
    assert failed, "losing chunks on every server lost nothing"
    r = failed[0]
    assert any("unrecoverable" in v or "unreadable" in v for v in r.violations)
    assert run_seed(r.seed) == r
    out = CliRunner().invoke(cli_main, [*r.replay.split()[1:], "--json"])
    assert out.exit_code == 3
    d = json.loads(out.output)
    assert d["seeds"] == 1 and d["failed"][0]["violations"] == list(r.violations)
    assert d["failed"][0]["replay"] == r.replay


def test_the_command_reports_seeds_faults_and_operations() -> None:
    out = CliRunner().invoke(cli_main, ["simulate", "faults", "--seeds", "3", "--seed", "5"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("3 seeds from 5: 0 failed, 0 violations")
    assert "faults injected" in out.output and "put ok" in out.output
    assert max(len(line) for line in out.output.splitlines()) <= 80
    out = CliRunner().invoke(cli_main, ["simulate", "faults", "--seeds", "2", "--json"])
    d = json.loads(out.output)
    assert d["seeds"] == 2 and d["violations"] == 0 and d["failed"] == []
    bad = CliRunner().invoke(cli_main, ["simulate", "faults", "--workload", "nope"])
    assert bad.exit_code == 2 and "nope" in bad.output
