"""Buggify points and planted bugs, for deterministic simulation testing (docs/dst.md).

As FoundationDB's ``BUGGIFY``: rare, seeded perturbations inside the real code (a reply
held back, a short read) that push it down the paths faults take, so that a simulation
run meets them far more often than a real cluster would. Outside a simulation run they
are off: ``fires()`` is then one test of a module global, and nothing else changes.

Planted bugs are the other way round: known mistakes, each behind a name, switched on only
by the tests that check that simulation catches them (``planted(name)``):

- ``ack-before-durable``: chunk writes are acknowledged before they are synced;
- ``manifest-before-data``: a checkpoint's rank 0 commits the step once its own process's
  ranks are written, not waiting for the other processes' data;
- ``repair-deletes-good``: repair deletes the good chunks it kept, with the bad ones.

Both are switched on for a block of code by ``active(seed, planted=...)``; the runs are
one thread and one at a time, so module state is enough.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable, Iterator

PLANTABLE = frozenset({"ack-before-durable", "manifest-before-data", "repair-deletes-good"})
CHANCE = 0.02  # how often a buggify point fires, when on

_rng: random.Random | None = None  # None: off (every run but a simulation's)
_planted: frozenset[str] = frozenset()


def fires(chance: float = CHANCE) -> bool:
    """Whether this buggify point perturbs this time: never outside a simulation run."""
    return _rng is not None and _rng.random() < chance


def draw(lo: float, hi: float) -> float:
    """A seeded number in [lo, hi) for a point that fired (how long to hold a reply)."""
    assert _rng is not None, "draw() only after fires()"
    return _rng.uniform(lo, hi)


def planted(name: str) -> bool:
    """Whether the planted bug ``name`` is switched on (only by the tests of simulation)."""
    return name in _planted


@contextlib.contextmanager
def active(seed: int, *, planted: Iterable[str] = ()) -> Iterator[None]:
    """Buggify points on, seeded by ``seed``, and the ``planted`` bugs, for the block."""
    global _rng, _planted
    names = frozenset(planted)
    if names - PLANTABLE:
        raise ValueError(f"no such planted bug: {', '.join(sorted(names - PLANTABLE))}")
    saved = _rng, _planted
    _rng, _planted = random.Random(f"buggify-{seed}"), names
    try:
        yield
    finally:
        _rng, _planted = saved


__all__ = ["CHANCE", "PLANTABLE", "active", "draw", "fires", "planted"]
