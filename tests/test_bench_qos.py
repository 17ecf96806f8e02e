"""``bench qos`` runs end to end (tiny sizes: it checks the plumbing, not the figures, which
docs/qos.md has from full runs), and its arithmetic."""

from __future__ import annotations

import asyncio
from pathlib import Path

import jsonschema
import pytest

from bench import qos


def test_loader_figures_count_bytes_and_compute_in_the_window() -> None:
    c = qos.COMPUTE_S
    # rank 0 got a batch of 10 MB at 1.0 and computed until 1.0 + c; rank 1 at 3.0
    steps = [(0, 0.5, 1.0, 10_000_000), (1, 2.0, 3.0, 10_000_000)]
    mb, au = qos.loader_figures(steps, 0.0, 2.0, ranks=2)
    assert mb == 5.0 and au == pytest.approx(c / 4, abs=1e-4)
    mb, au = qos.loader_figures(steps, 1.0 + c / 2, 3.0 + c / 2, ranks=2)
    assert mb == 5.0 and au == pytest.approx(c / 4, abs=1e-4)


def test_a_tiny_bench_runs_every_case(tmp_path: Path) -> None:
    res = asyncio.run(
        qos.run_qos_bench(
            directory=tmp_path,
            rounds=1,
            records=8,
            checkpoint_bytes=16 << 20,
            accelerators=1,
            ranks=2,
            alone_s=2.5,
        )
    )
    jsonschema.validate(res.to_dict(), qos.SCHEMA)
    assert [p.case for p in res.phases][:2] == ["loader alone", "checkpoint alone"]
    assert {p.case for p in res.phases} == set(qos.CASES)
    fair, off = res.median["together, fair"], res.median["together, off"]
    assert fair.checkpoint_gb_s and fair.bronze_share and fair.bronze_share > 0
    assert off.checkpoint_gb_s and off.bronze_share is None  # no scheduler, no figures
    assert res.median["loader alone"].loader_mb_s
    assert list(tmp_path.iterdir()) == []  # the cluster is gone
