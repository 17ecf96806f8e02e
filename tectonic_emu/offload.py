"""CPU work of the data path (encode, checksum, compress, decode) off the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

# Below this many bytes a checksum or copy is cheaper than a hop to a worker thread.
INLINE_CPU_BYTES = 256 << 10


async def offload(cpu: Executor, size: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, on a worker of ``cpu`` when it touches ``size`` bytes or more (so the
    loop keeps serving other ranks meanwhile), inline when that is cheaper than the hop."""
    if size < INLINE_CPU_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(cpu, fn, *args)


def run_apart(make: Callable[[], Coroutine[Any, Any, T]], *, name: str) -> T:
    """Run ``make()`` to the end on a thread and event loop of its own, and return its
    result or raise its error: blocking, but usable from inside a running loop too (for
    set-up work such as initialising a new metadata store from ``Cluster.create``)."""
    result: list[T] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            result.append(asyncio.run(make()))
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=work, name=name)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return result[0]


__all__ = ["INLINE_CPU_BYTES", "offload", "run_apart"]
