"""``bench sim --trace``: the same stages timed in a real run and in its projection."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from rich.console import Console

from bench.sim import run_sim_bench, trace_table
from bench.sim_trace import STAGES, Stage, StageStats, _target, compare, summary, traced
from clients.ckpt_parts import PartReader


def test_a_span_belongs_to_the_phase_it_starts_in_and_in_flight_is_its_share() -> None:
    spans = [
        ("rank save", 0.0, 2.0),
        ("rank save", 0.5, 1.0),
        ("block", 0.0, 1.0),
        ("block", 1.0, 2.0),
        ("block", 6.5, 6.6),  # in neither phase: left out
        ("rank load", 2.0, 6.0),  # starts as the save ends: the load's
        ("chunk read", 3.0, 5.0),
        ("chunk read", 3.0, 4.0),
    ]
    got = summary(spans)
    assert got["save", "block"] == StageStats(2, 1.0, 1.0, 2.0)
    assert got["save", "rank save"] == StageStats(2, 1.25, 1.25, 2.0)
    assert got["load", "rank load"] == StageStats(1, 4.0, 1.0, 4.0)
    assert got["load", "chunk read"] == StageStats(2, 1.5, 0.75, 3.0)
    assert set(got) == {
        ("save", "block"),
        ("save", "rank save"),
        ("load", "rank load"),
        ("load", "chunk read"),
    }
    trace = compare("x", spans, spans[:2])
    assert [(s.phase, s.stage) for s in trace.stages][:2] == [
        ("save", "rank save"),
        ("save", "block"),
    ]
    assert trace.stages[1].projected is None and trace.stages[0].projected is not None

    # Wide figures still fit 80 columns, a stage a line.
    wide = StageStats(24576, 1.3024, 1172.6, 12.345)
    trace = compare("x", [], [])
    trace.stages.extend(Stage("save", "block commit", wide, wide) for _ in range(3))
    out = io.StringIO()
    Console(file=out, width=80).print(trace_table(trace))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert sum("save: block commit" in line for line in lines) == 3
    assert "24,576/24,576" in out.getvalue() and "1,302/1,302" in out.getvalue()


def test_traced_wraps_every_stage_while_entered_and_puts_them_back() -> None:
    before = {where: _target(where)[0].__dict__[_target(where)[1]] for _, where in STAGES}
    with traced() as spans:
        assert (
            PartReader.__dict__["read_arena"]
            is not before["clients.ckpt_parts:PartReader.read_arena"]
        )
    assert spans == []
    assert {where: _target(where)[0].__dict__[_target(where)[1]] for _, where in STAGES} == before
    with pytest.raises(TypeError), traced([("x", "clients.ckpt_parts:PartReader.__init__")]):
        pass


def test_a_traced_run_has_the_same_blocks_chunk_writes_and_arenas_on_both_sides(
    tmp_path: Path,
) -> None:
    """The same code makes the same calls: a tiny rs-6-3 save and load of 16 ranks, traced
    for real and projected."""
    res = asyncio.run(
        run_sim_bench(
            directory=tmp_path,
            scale=0.0005,
            runs=1,
            encodings=["rs-6-3"],
            ranks=[16],
            fail=False,
            paper_ranks=0,
            hold_pages=False,
            trace=True,
        )
    )
    (trace,) = res.traces
    assert trace.name == "rs-6-3 save, 16 ranks"
    by = {(s.phase, s.stage): s for s in trace.stages}
    for key in [("save", "block"), ("save", "chunk write"), ("load", "arena")]:
        real, projected = by[key].real, by[key].projected
        assert real is not None and projected is not None
        assert real.calls == projected.calls > 0, key
    assert by["save", "rank save"].real.calls == 16  # type: ignore[union-attr]
    assert by["load", "rank load"].projected.calls == 16  # type: ignore[union-attr]
