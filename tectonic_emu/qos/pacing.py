"""Client-side pacing of a TrafficGroup, as Tectonic's client-side leaky bucket.

A group with a ``rate`` sends its bytes no faster than that from each client: every block
written or read waits its turn on the group's bucket, which lets ``BURST_S`` seconds' worth
through at once. A group without a rate is not paced (the nodes' fair queues still share
their disks by weight). The bucket is the generic cell rate algorithm's: one number, the
theoretical arrival time of the next byte, so a paced request costs one subtraction.
"""

from __future__ import annotations

import asyncio

from tectonic_emu import clock
from tectonic_emu.qos.groups import current

BURST_S = 0.1  # seconds of a group's rate let through at once


class Pacing:
    """The buckets of one client (``DataPath``), one per paced group, made when first used."""

    def __init__(self) -> None:
        self._due: dict[str, float] = {}  # per group: when its bytes so far are due
        self.waited_s = 0.0  # seconds requests waited here, in all

    async def take(self, nbytes: int) -> None:
        """Wait until the current group may send ``nbytes`` (at once when it has no rate)."""
        group = current()
        if not group.rate or nbytes <= 0:
            return
        now = clock.monotonic()
        due = max(now, self._due.get(group.name, now)) + nbytes / group.rate
        self._due[group.name] = due
        wait = due - now - BURST_S
        if wait > 0:
            self.waited_s += wait
            await asyncio.sleep(wait)


__all__ = ["BURST_S", "Pacing"]
