"""``bench sim``: the this-machine preset measured, and projections beside real runs."""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
from pathlib import Path
from typing import Any

from bench import sim, sim_rounds
from bench.sim import run_sim_bench
from clients.ckpt_models import checkpoint_plan
from tectonic_emu.bufpool import PAGE
from tectonic_emu.chunkstore import LocalNode
from tectonic_emu.coding._native import pinned
from tectonic_emu.sim import machine
from tectonic_emu.sim.cpu import COPY_SIZES
from tectonic_emu.sim.machine import BIG_CHUNK, PAGE_REPORTING, Device
from tectonic_emu.sim.machine import device_busy_s as machine_busy_s


def test_a_quick_run_measures_the_machine_and_pairs_each_real_run_with_its_projection(
    tmp_path: Path,
) -> None:
    """Two rounds of a tiny rs-6-3 save at 16 ranks, the same save with a node stopped and
    with a node slowed: every row has its real durations and its projection, the ratio is
    theirs, the machine's figures are measured (positive), and the projection's hardware is
    built from them; free page reporting was held off where it could be, and put back. The
    burst beside the paper (here 256 ranks of a 0.5 GB llama3-405b) has its figures over the
    paper's."""
    order_before = PAGE_REPORTING.read_text() if PAGE_REPORTING.exists() else ""
    res = asyncio.run(
        run_sim_bench(
            directory=tmp_path,
            scale=0.0005,
            runs=2,
            encodings=["rs-6-3"],
            ranks=[16],
            paper_ranks=256,
            paper_scale=0.0001,
            warm_bytes=64 << 20,
        )
    )
    names = [r.name for r in res.rows]
    assert names == [
        "rs-6-3 save, 16 ranks",
        "rs-6-3 save, 16 ranks: load",
        "rs-6-3 save, 16 ranks, node stopped",
        "rs-6-3 save, 16 ranks, slow node",
        "rs-6-3 save, 16 ranks, slow node: load",
    ]
    for row in res.rows:
        assert len(row.real_s) == 2 and all(s > 0 for s in row.real_s)
        assert row.projected_s > 0 and row.fresh_gb_s > 0  # measured before each load
        assert row.ratio == row.projected_s / statistics.median(row.real_s)
        # a save's loop and device busy, each round's and the projection's; not a load's
        save = not row.name.endswith(": load")
        assert len(row.loop_busy) == len(row.device_busy) == (2 if save else 0)
        assert all(0 < b <= 1.5 for b in row.loop_busy)  # CPU time may pass wall time a bit
        assert all(0 <= b <= 1 for b in row.device_busy)
        assert (0 < row.projected_loop_busy <= 1) == save
        assert (0 < row.projected_device_busy <= 1) == save
    if machine_busy_s(tmp_path) is not None:  # a block device under tmp_path: it wrote
        assert all(b > 0 for row in res.rows for b in row.device_busy)
    m = res.machine
    assert min(m.write_gb_s, m.read_gb_s, m.write_iops, m.read_iops, m.meta_ops) > 0
    assert 0 < m.call_s < 1 and 0 < m.txn_s < 1 and m.cores >= 1
    hw = m.hardware()
    assert hw.embedded and hw.devices == 1 and hw.disk.write_bw == m.write_gb_s * 1e9
    # copies measured at each value size the scenarios load (clamped) and at a chunk
    lo, hi = COPY_SIZES
    plan = checkpoint_plan(sim_rounds.MODEL, 16, 0.0005)
    sizes = {min(max(f.size, lo), hi) for r in plan.per_rank for f in r.files} | {BIG_CHUNK}
    assert set(m.copy_gb_s) == {str(n) for n in sizes} and min(m.copy_gb_s.values()) > 0
    assert hw.cpu is not None
    assert dict(hw.cpu.copy_sizes) == {int(n): r for n, r in m.copy_gb_s.items()}
    assert 0 < m.reply_share < 1 and hw.cpu.reply_share == m.reply_share
    # the loop's Python per block and per rank's save (clients/loop_python.py)
    assert set(m.python_s) == {"block", "rank-save"} and dict(hw.cpu.python_s) == m.python_s
    assert not list(tmp_path.iterdir())  # every cluster and file cleaned up
    assert res.pages_held or os.geteuid() != 0 or not PAGE_REPORTING.exists()
    assert (res.warmed_gb, res.warm_s > 0) == (
        ((64 << 20) / 1e9, True) if res.pages_held else (0.0, False)
    )
    assert not PAGE_REPORTING.exists() or PAGE_REPORTING.read_text() == order_before
    machine, busy, paper = sim.table(res)
    assert "ratio = projected / real median" in str(machine.caption)
    assert busy.row_count == 3  # the saves
    p = res.paper
    assert p is not None and p.ranks == 256 and p.duration_s > 0 and p.peak_gb_s > 0
    assert p.peak_ratio == p.peak_gb_s / 7000 and p.sustained_ratio == p.sustained_gb_s / 2000
    assert "FITTED" in str(paper.caption)


def test_cases_cover_each_encoding_at_each_rank_count_a_failure_and_a_slow_node() -> None:
    got = sim_rounds.cases(["r1", "rs-6-3"], [16, 1024], fail=True)
    assert [(c.encoding, c.ranks, c.fail, c.slow) for c in got] == [
        ("r1", 16, False, False),
        ("rs-6-3", 16, False, False),
        ("r1", 1024, False, False),
        ("rs-6-3", 1024, False, False),
        ("rs-6-3", 16, True, False),
        ("rs-6-3", 16, False, True),
    ]
    assert len(sim_rounds.cases(["r1"], [16], fail=False)) == 1


def test_the_this_machine_preset_is_an_embedded_cluster_of_the_measured_figures() -> None:
    """``machine_preset`` (what ``simulate checkpoint --preset this-machine`` measures and
    uses): every rank on the one host, blocks acknowledged once all chunks are durable, the
    cluster's default blocks, the measured figures in its hardware; a small projection on it
    never beats its own lower bound."""
    from clients.projection import Scenario, machine_preset, project_checkpoint
    from tectonic_emu.coding.work import KINDS
    from tectonic_emu.config import DEFAULT_BLOCK_SIZE
    from tectonic_emu.sim.machine import Machine

    m = Machine(1.0, 2.0, 1000.0, 2000.0, 2e-4, 4e-4, 8000.0, 2, {k: 2.0 for k in KINDS}, True)
    p = machine_preset(m)
    assert p.ranks_per_host is None and p.write_ack == "all" and p.block_size == DEFAULT_BLOCK_SIZE
    assert p.hardware.embedded and p.hardware.disk.read_bw == 2e9 and p.hardware.cpu is not None
    sc = Scenario("llama3-8b", 16, "rs-6-3", p.hardware, ranks_per_host=16, scale=0.001,
                  block_size=p.block_size, write_ack=p.write_ack)  # fmt: skip
    got = project_checkpoint(sc)
    assert got.hosts == 1 and got.lower_bound_s <= got.duration_s
    assert got.load is not None and got.load.lower_bound_s <= got.load.duration_s


def test_page_reporting_is_held_off_within_and_put_back_after(tmp_path: Path) -> None:
    """The kernel's parameter (a file here) reads an order no block reaches while held, and
    its order before once left, an error inside or not; where there is no such parameter
    (no free page reporting, or not root), nothing is held and nothing is written."""
    from tectonic_emu.sim.machine import NO_REPORTING_ORDER, page_reporting_held

    param = tmp_path / "page_reporting_order"
    param.write_text("9\n")
    with page_reporting_held(param) as held:
        assert held and param.read_text().strip() == str(NO_REPORTING_ORDER)
    assert param.read_text().strip() == "9"
    try:
        with page_reporting_held(param):
            raise KeyError("inside")
    except KeyError:
        pass
    assert param.read_text().strip() == "9"
    missing = tmp_path / "none" / "page_reporting_order"
    with page_reporting_held(missing) as held:
        assert not held
    assert not missing.exists()


def test_warming_touches_what_it_is_asked_and_gives_it_back() -> None:
    """``warm_free_memory`` maps and touches the bytes asked for, more than one step of
    them at once (so that they are distinct pages), and unmaps them."""
    from tectonic_emu.sim.machine import warm_free_memory

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    assert warm_free_memory((300 << 20) + 12345) > 0
    touched = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert touched >= (300 << 20) // (2 << 20)  # a fault a page, at most 2 MiB (huge)


def test_apart_runs_in_a_new_process_and_returns_its_result() -> None:
    """Each real round runs in a process of its own (bench/sim_rounds.py: its heap is new)."""
    pid = asyncio.run(sim_rounds.apart(os.getpid))
    assert pid != os.getpid()
    assert asyncio.run(sim_rounds.apart(sum, [1, 2, 3])) == 6


def test_the_device_is_measured_with_chunks_from_buffers_of_a_writers_kind(
    tmp_path: Path,
) -> None:
    """A real node, its writes recorded: every big chunk comes from one of ``SOURCES``
    page-aligned buffers (the kind a writer's blocks are, not one fresh ``mmap``), each
    holding the same bytes, which the node stores and reads back; nothing is left after."""
    sources: dict[int, bytes] = {}

    class Recorded(LocalNode):
        async def write_chunk(self, disk: int, chunk_id: str, payload: Any, **kw: Any) -> Any:
            if chunk_id.startswith("b"):
                with pinned([memoryview(payload)]) as [(address, n)]:
                    assert address % PAGE == 0 and n == BIG_CHUNK
                    sources[address] = bytes(payload)
            return await super().write_chunk(disk, chunk_id, payload, **kw)

    async def go() -> tuple[Device, list[Any]]:
        node = Recorded(tmp_path / "node", 0, 1)
        try:
            device = await machine._device(node, 6 * BIG_CHUNK)
            return device, await node.list_chunks(0)
        finally:
            await node.close()

    device, left = asyncio.run(go())
    assert len(sources) == machine.SOURCES and len(set(sources.values())) == 1
    assert device.write_gb_s > 0 and device.read_gb_s > 0 and device.write_latency_s >= 0
    assert left == []
