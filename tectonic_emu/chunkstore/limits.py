"""What one node process gives any one peer, and what it does when it runs short.

A node serves many clients from one event loop, so no client may hold what the others need:

- **Stalled frames.** A frame whose first byte has arrived must keep arriving: a connection
  that sends nothing for ``FRAME_STALL_TIMEOUT`` seconds mid-frame is closed, and the payload
  buffer it held goes back to the pool. (Time the node itself stops reading, for backpressure
  or the emulated NIC, does not count.)
- **Idle connections.** One with no request running and no byte for ``IDLE_TIMEOUT`` seconds
  is closed; ``RemoteNode`` opens a new one on its next call. Unauthenticated connections are
  dropped sooner, after ``auth.HANDSHAKE_TIMEOUT``.
- **Buffers.** A connection holds at most ``per_connection_buffers`` of the node's WRITE
  payload buffers at once; past that it stops being read until one of its own comes back, so
  one client cannot take them all.
- **File descriptors.** The node raises its soft ``RLIMIT_NOFILE`` to the hard limit, and
  takes at most ``max_connections`` connections (the limit less ``FD_RESERVE`` for chunk
  files and the rest): one more is closed at once. asyncio's accept loop never sees EMFILE
  then; if something else uses up the descriptors, its "out of system resource" line is
  logged at most once per interval instead of thousands of times a second.

Refusals and closings are logged through ``auth.RefusalLog``: one line per interval, with a
count of the lines left out.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from tectonic_emu.chunkstore.auth import RefusalLog

# Seconds a begun frame may go without a byte, and a connection without any traffic.
FRAME_STALL_TIMEOUT = 5.0
IDLE_TIMEOUT = 300.0
# How often the sweeper looks.
SWEEP_INTERVAL = 0.5
# Descriptors kept for chunk files, the listening socket, logs and the like.
FD_RESERVE = 256


class Watched(Protocol):
    """A connection as the sweeper sees it."""

    closed: bool

    def quiet_for(self, now: float) -> tuple[float, bool, bool]:
        """(seconds since its last byte, mid-frame and being read, requests running)."""
        ...

    def close_for(self, reason: str) -> None: ...


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to the hard one; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass  # not allowed: keep what we have
    return soft


def max_connections(fd_limit: int) -> int:
    """Connections one node takes with ``fd_limit`` descriptors."""
    return max(16, fd_limit - FD_RESERVE)


async def sweep(
    connections: Callable[[], Iterable[Watched]],
    *,
    stall: float = FRAME_STALL_TIMEOUT,
    idle: float = IDLE_TIMEOUT,
    interval: float = SWEEP_INTERVAL,
) -> None:
    """Close stalled and idle connections, every ``interval`` seconds, until cancelled."""
    while True:
        await asyncio.sleep(interval)
        now = time.monotonic()
        for conn in list(connections()):
            if conn.closed:
                continue
            quiet, mid_frame, running = conn.quiet_for(now)
            if mid_frame and quiet >= stall:
                conn.close_for(f"a frame stalled: no byte for {quiet:.0f} s")
            elif not mid_frame and not running and quiet >= idle:
                conn.close_for(f"idle for {quiet:.0f} s")


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, log: RefusalLog) -> None:
    """Route asyncio's "socket.accept() out of system resource" lines through ``log`` (it
    retries accept on its own, once a second); other errors go to the default handler."""
    previous = loop.get_exception_handler()

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if "out of system resource" in str(context.get("message", "")):
            log.refused("new connections", f"{context.get('exception')} (accept backs off)")
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)


__all__ = [
    "FD_RESERVE",
    "FRAME_STALL_TIMEOUT",
    "IDLE_TIMEOUT",
    "max_connections",
    "quiet_accept_errors",
    "raise_fd_limit",
    "sweep",
]
