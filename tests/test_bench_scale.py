"""``bench scale``: a tiny run checked against its schema, its plot, and its read-back check."""

from __future__ import annotations

import asyncio
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import bench.scale as scale
from bench.scale import (
    SCHEMA,
    ReadBackError,
    ScaleBench,
    plot,
    run_scale_bench,
    split_states,
    table,
    verify,
)
from clients.checkpoint import Shard
from tectonic_emu.errors import InvalidArgumentError

SIZE = 4 << 20
RANKS = (1, 16, 64)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> ScaleBench:
    work = tmp_path_factory.mktemp("scale")
    mp = pytest.MonkeyPatch()
    # Dropping the page cache is machine-wide: leave it to real runs on a shared machine.
    mp.setattr(scale, "drop_caches", lambda: False)
    try:
        log: list[tuple[str, float | None]] = []

        def step(text: str, fraction: float | None = None) -> None:
            log.append((text, fraction))

        out = asyncio.run(
            run_scale_bench(size=SIZE, directory=work, ranks=RANKS, runs=1, step=step)
        )
    finally:
        mp.undo()
    steps = [text for text, _ in log]
    assert "warm-up: 64 ranks load" in steps and "run 1/1: 16 ranks save" in steps
    assert {"run 1/1: 64 ranks load_many", "run 1/1: 64 ranks save_many"} <= set(steps)
    # Every stage moves the bar: from 0, never back, short of 1 (the last stage runs).
    fractions = [f for _, f in log]
    assert None not in fractions and fractions == sorted(fractions)
    assert fractions[0] == 0 and len(set(fractions)) == len(fractions) and fractions[-1] < 1
    assert list(work.iterdir()) == []  # its temp dir is gone
    return out


def test_tiny_run_matches_schema(result: ScaleBench) -> None:
    d = result.to_dict()
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(d, SCHEMA)
    assert d["size"] == SIZE and d["ranks"] == list(RANKS) and d["runs"] == 1
    assert d["cold_reads"] is False and d["load_in_flight"] is None
    assert d["raw_write_s"] > 0 and len(d["raw_write_runs_s"]) == 1
    by_n = {p["ranks"]: p for p in d["points"]}
    assert list(by_n) == list(RANKS)
    assert by_n[16]["save_vs_16"] == 1.0 and by_n[16]["load_vs_16"] == 1.0
    assert by_n[16]["load_many_vs_16"] == 1.0
    assert by_n[64]["rows_per_rank"] == SIZE // 1024 // 64
    for p in d["points"]:
        assert all(p[f"{what}_s"] > 0 for what in ("save", "load", "save_many", "load_many"))
        assert p["save_mb_s"] == pytest.approx(SIZE / p["save_s"] / 1e6, rel=0.01, abs=0.1)
    # 4,096 ranks not measured:
    assert d["target_met"] == dict.fromkeys(["save", "load", "save_many", "load_many"])
    assert table(result).row_count == 2 * len(RANKS)  # a call per rank, one call


def test_plot_writes_png(result: ScaleBench, tmp_path: Path) -> None:
    paths = plot(result, tmp_path / "plots")
    assert [p.name for p in paths] == ["scale-save.png", "scale-load.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000


def test_verify_catches_wrong_bytes() -> None:
    g = np.frombuffer(np.random.default_rng(0).bytes(64 << 10), np.float32).reshape(-1, 256)
    saved = split_states(g, 4)
    assert [s["w"].offset for s in saved] == [(0, 0), (16, 0), (32, 0), (48, 0)]
    verify(saved, [{"w": s["w"]} for s in saved])  # the same shards: fine
    bad = [{"w": s["w"]} for s in saved]
    arr = bad[2]["w"].array.copy()
    arr.view(np.uint8)[5] ^= 1
    bad[2] = {"w": Shard(arr, g.shape, (32, 0))}
    with pytest.raises(ReadBackError, match="rank 2"):
        verify(saved, bad)
    with pytest.raises(ReadBackError, match="rank 1"):
        verify(saved, [saved[0], {}, *saved[2:]])


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="fewer than"):
        asyncio.run(run_scale_bench(size=16 << 10, directory=Path("/nonexistent"), ranks=(64,)))
    with pytest.raises(InvalidArgumentError, match="runs"):
        asyncio.run(run_scale_bench(size=SIZE, directory=Path("/nonexistent"), runs=0))
