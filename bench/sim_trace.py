"""``bench sim --trace``: where a real run and its projection spend their time, stage by stage.

A projection that agrees with the real run on the total can still disagree on how it gets
there, and one that disagrees says little about where. Both run the same code, so the same
functions can be timed on both sides: ``traced`` wraps each stage's function (``STAGES``)
for as long as it is entered, and records every call's start and end on the running loop's
clock, which is the monotonic clock in a real run and virtual time in a projection.

Each span belongs to the phase it starts in: the save (from the first rank's ``save`` to
the last one's return) or the load. ``summary`` gives each stage's calls, their mean
duration, how many were in flight on average over the phase (the sum of their durations
over its length) and when the last one ended, from the phase's start. Two of these side by
side (``compare``) show, for example, a real load whose chunk reads kept 14 in flight where
its projection kept 23 (docs/simulate.md).

The wrapping is for measurement only: it adds a coroutine frame per call, so a traced
round is not one of the measured rounds.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# (stage, "module:Class.method"): each a coroutine function. A stage may name several
# functions (a real node's and a model node's), of which a run calls one.
STAGES: tuple[tuple[str, str], ...] = (
    ("rank save", "clients.checkpoint:Checkpointer.save"),
    ("batch", "clients.ckpt_commit:StepWriter._write_batch"),
    ("data file", "clients.ckpt_commit:StepWriter._write_data"),
    ("commit wait", "clients.ckpt_commit:StepWriter._await_commit"),
    ("publish", "clients.ckpt_commit:StepWriter._publish"),
    ("append", "tectonic_emu.writer:FileWriter.append_many"),
    ("submit", "tectonic_emu.writer:BlockPipeline.submit"),
    ("slot", "tectonic_emu.writer:BlockPipeline._run"),
    ("block", "tectonic_emu.datapath:DataPath.write_block"),
    ("chunk intent", "tectonic_emu.intents:ChunkIntent.__aenter__"),
    ("block commit", "tectonic_emu.client:Client.commit_blocks"),
    ("meta sync", "tectonic_emu.metadata.layers:Metadata.sync"),
    ("chunk write", "tectonic_emu.chunkstore._local:LocalNode.write_chunk"),
    ("chunk write", "tectonic_emu.sim.node:ModelNode.write_chunk"),
    ("rank load", "clients.checkpoint:Checkpointer.load"),
    ("load batch", "clients.ckpt_load:Loader._load_ranks"),
    ("arena", "clients.ckpt_parts:PartReader.read_arena"),
    ("chunk read", "tectonic_emu.chunkstore._local:LocalNode.read_chunk"),
    ("chunk read", "tectonic_emu.chunkstore._local:LocalNode.read_chunk_into"),
    ("chunk read", "tectonic_emu.sim.node:ModelNode.read_chunk"),  # its _into is the base's
)
PHASES = (("save", "rank save"), ("load", "rank load"))  # each phase and the stage it spans

Span = tuple[str, float, float]  # stage, start, end (the loop's clock)


def _target(where: str) -> tuple[type, str]:
    module, _, attr = where.partition(":")
    cls_name, _, method = attr.partition(".")
    return getattr(importlib.import_module(module), cls_name), method


def _timed(
    fn: Callable[..., Awaitable[Any]], stage: str, spans: list[Span]
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fn)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        now = asyncio.get_running_loop().time
        start = now()
        try:
            return await fn(*args, **kwargs)
        finally:
            spans.append((stage, start, now()))

    return timed


@contextmanager
def traced(stages: Sequence[tuple[str, str]] = STAGES) -> Iterator[list[Span]]:
    """Every call of each stage's function, while entered, appended to the list it yields
    (one process, one run at a time: the functions are wrapped on their classes)."""
    spans: list[Span] = []
    undo: list[tuple[type, str, Any]] = []
    try:
        for stage, where in stages:
            cls, name = _target(where)
            fn = cls.__dict__.get(name)
            if not asyncio.iscoroutinefunction(fn):
                raise TypeError(f"{where} is not a coroutine function defined there")
            undo.append((cls, name, fn))
            setattr(cls, name, _timed(fn, stage, spans))
        yield spans
    finally:
        for cls, name, fn in reversed(undo):
            setattr(cls, name, fn)


@dataclass(frozen=True, slots=True)
class StageStats:
    """One stage within one phase: its calls, their mean duration, the mean number in
    flight over the phase, and when the last ended (seconds from the phase's start)."""

    calls: int
    mean_s: float
    in_flight: float
    last_end_s: float


@dataclass(frozen=True, slots=True)
class Stage:
    """A stage of a phase, on both sides (None: no call there)."""

    phase: str
    stage: str
    real: StageStats | None
    projected: StageStats | None


@dataclass(frozen=True, slots=True)
class CaseTrace:
    name: str
    stages: list[Stage]


def summary(spans: Sequence[Span]) -> dict[tuple[str, str], StageStats]:
    """(phase, stage) -> its figures (module docstring). Spans that start in neither phase
    (the drain after a save, say) are left out; one that starts as the save ends and the
    load begins (a projection's, in virtual time) is the load's."""
    bounds: list[tuple[str, float, float]] = []
    for phase, stage in PHASES:
        mine = [(a, b) for s, a, b in spans if s == stage]
        if mine:
            bounds.append((phase, min(a for a, _ in mine), max(b for _, b in mine)))
    by: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for stage, a, b in spans:
        for phase, lo, hi in reversed(bounds):  # the later phase, where one ends as one starts
            if lo <= a <= hi:
                by.setdefault((phase, stage), []).append((a - lo, b - lo))
                break
    length = {phase: max(hi - lo, 1e-9) for phase, lo, hi in bounds}
    out = {}
    for (phase, stage), got in by.items():
        busy = sum(b - a for a, b in got)
        out[phase, stage] = StageStats(
            len(got), busy / len(got), busy / length[phase], max(b for _, b in got)
        )
    return out


def compare(name: str, real: Sequence[Span], projected: Sequence[Span]) -> CaseTrace:
    """The two runs' summaries, stage beside stage, in ``STAGES``' order by phase."""
    r, p = summary(real), summary(projected)
    order = list(dict.fromkeys(stage for stage, _ in STAGES))
    keys = sorted(
        set(r) | set(p),
        key=lambda k: ([ph for ph, _ in PHASES].index(k[0]), order.index(k[1])),
    )
    return CaseTrace(name, [Stage(ph, st, r.get((ph, st)), p.get((ph, st))) for ph, st in keys])


__all__ = ["PHASES", "STAGES", "CaseTrace", "Stage", "StageStats", "compare", "summary", "traced"]
