"""Where ids, tokens and placement draw their randomness.

Real runs draw ids and write tokens from the system's CSPRNG (``secrets``), and placement
from a fresh ``random.Random``. A projection runs under ``seeded(seed)``: every draw then comes
from one generator seeded once, in the order the run makes them, so that the same seed gives
the same run, byte for byte (virtual time, ``clock.py``, keeps that order fixed). The seed
lives in a context variable: only code that runs inside ``seeded`` (the tasks it starts
included) sees it.
"""

from __future__ import annotations

import contextlib
import contextvars
import random
import secrets
from collections.abc import Iterator

_SEEDED: contextvars.ContextVar[random.Random | None] = contextvars.ContextVar(
    "tectonic_emu_seeded", default=None
)


def randbits(k: int) -> int:
    """``k`` random bits: ``secrets.randbits``, or the seeded generator's."""
    rng = _SEEDED.get()
    return secrets.randbits(k) if rng is None else rng.getrandbits(k)


def token_hex(nbytes: int) -> str:
    """A random hex string of ``nbytes`` bytes: ``secrets.token_hex``, or seeded."""
    rng = _SEEDED.get()
    return secrets.token_hex(nbytes) if rng is None else rng.randbytes(nbytes).hex()


def new_rng() -> random.Random:
    """A generator for placement and replica order: seeded from the run's seed under
    ``seeded``, else seeded by the system."""
    rng = _SEEDED.get()
    return random.Random() if rng is None else random.Random(rng.getrandbits(64))


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Draw from a generator seeded with ``seed`` inside the block (module docstring)."""
    token = _SEEDED.set(random.Random(seed))
    try:
        yield
    finally:
        _SEEDED.reset(token)


__all__ = ["new_rng", "randbits", "seeded", "token_hex"]
