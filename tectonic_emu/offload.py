"""CPU work of the data path (encode, checksum, compress, decode) off the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

from tectonic_emu.coding import work

T = TypeVar("T")

# Below this many bytes a checksum or copy is cheaper than a hop to a worker thread.
INLINE_CPU_BYTES = 256 << 10


async def offload(cpu: Executor, size: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, on a worker of ``cpu`` when it touches ``size`` bytes or more (so the
    loop keeps serving other ranks meanwhile), inline when that is cheaper than the hop."""
    if size < INLINE_CPU_BYTES:
        result = fn(*args)
    elif isinstance(cpu, InlineExecutor):  # it would run it here anyway, a loop hop later;
        # in a projection it stands for a pool: a thread's work, and the hop there and
        # back costs the loop what a node call's hop to the I/O pool does
        work.calls(1)
        with work.on_thread():
            result = fn(*args)
        work.calls(1, replies=True)
    else:
        return await asyncio.get_running_loop().run_in_executor(cpu, fn, *args)
    await work.settle()  # a projection's host charges the work here (coding/work.py)
    return result


class InlineExecutor(ThreadPoolExecutor):
    """An executor that runs each job at once on the calling thread: the default executor of
    a virtual-time loop (clock.py), and the CPU and I/O pools of a projected cluster, where
    work handed to threads would finish in an order set by the machine, not by the run. (A
    ThreadPoolExecutor that never starts a thread, since asyncio's default executor must be
    one.)"""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # delivered to whoever awaits the job, as a pool would
            future.set_exception(exc)
        return future


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


__all__ = ["INLINE_CPU_BYTES", "InlineExecutor", "offload", "run_apart"]
