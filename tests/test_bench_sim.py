"""``bench sim``: the this-machine preset measured, and projections beside real runs."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

from bench import sim
from bench.sim import run_sim_bench


def test_a_quick_run_measures_the_machine_and_pairs_each_real_run_with_its_projection(
    tmp_path: Path,
) -> None:
    """One round of a tiny rs-6-3 save at 16 ranks and the same save with a node stopped:
    every row has its real durations and its projection, the ratio is theirs, the machine's
    figures are measured (positive), and the projection's hardware is built from them."""
    res = asyncio.run(
        run_sim_bench(directory=tmp_path, scale=0.0005, runs=2, encodings=["rs-6-3"], ranks=[16])
    )
    names = [r.name for r in res.rows]
    assert names == [
        "rs-6-3 save, 16 ranks",
        "rs-6-3 save, 16 ranks: load",
        "rs-6-3 save, 16 ranks, node stopped",
    ]
    for row in res.rows:
        assert len(row.real_s) == 2 and all(s > 0 for s in row.real_s)
        assert row.projected_s > 0
        assert row.ratio == row.projected_s / statistics.median(row.real_s)
    m = res.machine
    assert min(m.write_gb_s, m.read_gb_s, m.write_iops, m.read_iops, m.meta_ops) > 0
    assert 0 < m.call_s < 1 and 0 < m.txn_s < 1 and m.cores >= 1
    hw = m.hardware()
    assert hw.embedded and hw.devices == 1 and hw.disk.write_bw == m.write_gb_s * 1e9
    assert not list(tmp_path.iterdir())  # every cluster and file cleaned up
    text = str(sim.table(res).caption)
    assert "ratio = projected / real median" in text


def test_cases_cover_each_encoding_at_each_rank_count_and_one_failure() -> None:
    got = sim.cases(["r1", "rs-6-3"], [16, 1024], fail=True)
    assert [(c.encoding, c.ranks, c.fail) for c in got] == [
        ("r1", 16, False),
        ("rs-6-3", 16, False),
        ("r1", 1024, False),
        ("rs-6-3", 1024, False),
        ("rs-6-3", 16, True),
    ]
