"""The ``checkpoint`` workload of deterministic simulation testing: ranks on the client
hosts save ``STEPS`` checkpoints through the real ``Checkpointer`` (one per host, as a
training job's processes have), while faults fall and, now and then, one rank crashes in
the middle of its save (its task cancelled).

What must hold (``Saves``):

- a step whose save returned to any rank is committed;
- a step that did not commit leaves the step before it latest (a failed save changes
  nothing anyone loads);
- every committed step loads back, for every rank, exactly what that rank saved: no
  committed checkpoint is partial.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clients.checkpoint import Checkpointer
from clients.ckpt_format import CheckpointAbortedError
from clients.dst.files import REFUSALS, refused, until_up

STEPS = 3
RANKS_PER_HOST = 2
CRASH = 0.3  # the chance that a rank crashes during a step's save
ROOT = "/ckpt"

# What a rank's save may answer while faults fall and other ranks crash: the step failed
# everywhere (a rank gave up, or did not come in time), or a write was refused (and the
# metadata store's outages: ``files.refused``).
FAILURES = (CheckpointAbortedError, *REFUSALS)


@dataclass(slots=True)
class Saves:
    """Each rank's state per step saved, and what happened to each step."""

    states: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    committed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.outcomes[what] = self.outcomes.get(what, 0) + 1


def _state(rng: random.Random) -> dict[str, Any]:
    n = rng.randrange(1, 40_000)
    return {
        "w": np.frombuffer(rng.randbytes(4 * n), dtype=np.float32).copy(),
        "step_info": rng.randbytes(rng.randrange(0, 200)),
    }


def checkpointers(clients: Sequence[Any], timeout: float) -> list[Checkpointer]:
    """One ``Checkpointer`` per host client, for ``RANKS_PER_HOST`` ranks each."""
    world = RANKS_PER_HOST * len(clients)
    return [Checkpointer(c, ROOT, world_size=world, timeout=timeout) for c in clients]


async def run_saves(
    ckpts: Sequence[Checkpointer], rng: random.Random, saves: Saves, violations: list[str]
) -> None:
    world = ckpts[0].world_size
    await until_up(lambda: ckpts[0].client.mkdir(ROOT, exist_ok=True))
    for step in range(1, STEPS + 1):
        states = {r: _state(rng) for r in range(world)}
        saves.states[step] = states
        crashed = rng.randrange(world) if rng.random() < CRASH else None
        delay = rng.uniform(0.0, 0.02)
        tasks = {
            r: asyncio.ensure_future(ckpts[r // RANKS_PER_HOST].save(step, r, states[r]))
            for r in range(world)
        }
        if crashed is not None:
            await asyncio.sleep(delay)
            tasks[crashed].cancel()
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        returned = False
        for r, res in zip(tasks, results, strict=True):
            if r == crashed and isinstance(res, asyncio.CancelledError):
                saves.count("save crashed")
            elif isinstance(res, FAILURES) or refused(res):
                saves.count(f"save {type(res).__name__}")
            elif isinstance(res, BaseException):
                violations.append(f"step {step}: rank {r}'s save raised {res!r}")
            else:
                returned = True
                saves.count("save ok")
        done = await until_up(ckpts[0].steps)
        if step in done:
            saves.committed.append(step)
        else:
            saves.failed.append(step)
            if returned:
                violations.append(f"step {step}: a rank's save returned, yet it is not committed")
            before = saves.committed[-1] if saves.committed else None
            latest = done[-1] if done else None
            if latest != before:
                violations.append(
                    f"step {step} failed, and the latest step is {latest}, not {before}"
                )
        # A crashed rank comes back for the next step (a restarted process would).


async def check_saves(ckpts: Sequence[Checkpointer], saves: Saves) -> list[str]:
    """Every committed step loads back exactly, for every rank (each from its host)."""
    out: list[str] = []
    if await ckpts[0].steps() != saves.committed:
        out.append(f"committed steps {await ckpts[0].steps()}, expected {saves.committed}")
    for step in saves.committed:
        for rank, want in saves.states[step].items():
            try:
                got = await ckpts[rank // RANKS_PER_HOST].load(rank, step)
            except Exception as exc:  # reported
                out.append(f"step {step} rank {rank} does not load: {type(exc).__name__}: {exc}")
                continue
            why = _differ(got, want)
            if why:
                out.append(f"step {step} rank {rank}, committed, {why}")
    return out


def _differ(got: Mapping[str, Any], want: Mapping[str, Any]) -> str:
    """How a loaded state differs from the saved one ("": it does not)."""
    if set(got) != set(want):
        return f"loads the values {sorted(got)} of the {sorted(want)} saved: partial"
    for k in sorted(want):
        if bytes(memoryview(got[k]).cast("B")) != bytes(memoryview(want[k]).cast("B")):
            return f"loads other bytes for {k!r} than it saved"
    return ""


__all__ = ["FAILURES", "STEPS", "Saves", "check_saves", "checkpointers", "run_saves"]
