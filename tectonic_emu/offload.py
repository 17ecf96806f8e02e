"""CPU work of the data path (encode, checksum, compress, decode) off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

T = TypeVar("T")

# Below this many bytes a checksum or copy is cheaper than a hop to a worker thread.
INLINE_CPU_BYTES = 256 << 10


async def offload(cpu: Executor, size: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, on a worker of ``cpu`` when it touches ``size`` bytes or more (so the
    loop keeps serving other ranks meanwhile), inline when that is cheaper than the hop."""
    if size < INLINE_CPU_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(cpu, fn, *args)


__all__ = ["INLINE_CPU_BYTES", "offload"]
