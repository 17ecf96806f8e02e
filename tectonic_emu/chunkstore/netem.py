"""An emulated network, applied by the chunk transport itself (this kernel has no netem qdisc).

``cluster create --nic-gbps X --rtt-ms Y --loss P`` gives every host of a served or multi-host
cluster a NIC of ``X`` Gb/s each way, ``Y`` ms of round-trip time, and a segment loss rate of
``P``. Each process that talks to nodes (a node server, a client) owns one ``Pacer``, its
host's NIC, shared by all its connections:

- **Bandwidth, sending.** Every frame reserves its bytes on the egress line (``Line``):
  frames are sent one after another at ``X`` Gb/s, in the order they asked, whichever
  connection they go out on. A frame waits until its last byte would have left the NIC,
  then goes to the socket at once.
- **Bandwidth, receiving.** Received bytes are taken from an ingress token bucket of ``X``
  Gb/s holding up to one chunk (``burst``). When it runs dry, the connection stops reading
  until the bucket refills. One sender at ``X`` passes untouched. Several senders into one
  host, such as a read of an RS stripe from six nodes, share its ``X``.
- **Latency.** Every frame is held back by half the round trip before it is sent, so one
  request and its reply take ``Y`` ms more. Frames are held independently: pipelined
  requests keep the line busy, as on a real link with a long round trip.
- **Loss.** Each 1,448-byte segment of a frame is lost with probability ``P``. TCP resends
  it: a loss in the body of a frame costs one round trip (fast retransmit, at least 1 ms). A
  loss among a frame's last three segments, which too few duplicate ACKs follow, costs
  Linux's minimum retransmission timeout, 200 ms, or the round trip if that is longer.

What is not modelled: congestion windows, switch queues, and a host's NIC shared by several
processes (each process paces alone). Delays are kept to the nearest millisecond (``hold``):
a round trip is good to about a millisecond, so sub-millisecond round trips cannot be
modelled. ``bench net`` measures a paced link against its settings.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from tectonic_emu import clock

SEGMENT = 1448  # bytes of payload in one TCP segment on a 1,500-byte MTU
TAIL_SEGMENTS = 3  # a loss here has too few duplicate ACKs behind it for fast retransmit
MIN_RTO = 0.2  # Linux's TCP_RTO_MIN
MIN_RETRANSMIT = 0.001
FRAME_OVERHEAD = 64 << 10  # room in the ingress burst for a frame's header and meta
TIMER_LATE_MS = 0.15  # how late asyncio's timer wake-ups run here (measured)


@dataclass(frozen=True, slots=True)
class LinkModel:
    """A host's NIC: ``gbps`` each way (0: unlimited), ``rtt_ms`` added to every exchange,
    ``loss`` the probability that a segment is lost."""

    gbps: float = 0.0
    rtt_ms: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gbps) and 0 <= self.gbps <= 10_000):
            raise ValueError(f"NIC bandwidth must be 0..10000 Gb/s (0: unlimited), not {self.gbps}")
        if not (math.isfinite(self.rtt_ms) and 0 <= self.rtt_ms <= 60_000):
            raise ValueError(f"round-trip time must be 0..60000 ms, not {self.rtt_ms}")
        if not (math.isfinite(self.loss) and 0 <= self.loss < 1):
            raise ValueError(f"loss must be at least 0 and below 1, not {self.loss}")

    @property
    def active(self) -> bool:
        return bool(self.gbps or self.rtt_ms or self.loss)


async def hold(seconds: float) -> None:
    """Sleep about ``seconds``, to the nearest millisecond. asyncio's timers wake on whole
    milliseconds, rounded up (epoll's timeout), about 0.15 ms late here: a plain
    ``asyncio.sleep(0.0015)`` takes 2.2 ms. Sleeping the whole milliseconds nearest the
    deadline centres the error on zero, within half a millisecond. In virtual time
    (clock.py), where timers fire exactly, it sleeps exactly ``seconds``."""
    if clock.current().virtual:
        await asyncio.sleep(seconds)
        return
    ms = round(seconds * 1000 - TIMER_LATE_MS)
    if ms >= 1:
        await asyncio.sleep(ms / 1000 - 1e-5)


class Line:
    """Bytes leave one at a time at ``rate`` bytes/s: ``reserve(n)`` returns the seconds until
    the last of ``n`` bytes, queued behind every earlier reservation, has left."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._free_at = 0.0  # clock.monotonic() when the line is next idle

    def reserve(self, n: int) -> float:
        now = clock.monotonic()
        self._free_at = max(now, self._free_at) + n / self.rate
        return self._free_at - now


class Bucket:
    """A token bucket: ``rate`` bytes/s, at most ``burst`` bytes saved up. ``take(n)``
    returns the seconds to wait before the bytes after these may come (0: none)."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = clock.monotonic()

    def take(self, n: int) -> float:
        now = clock.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= n
        return -self._tokens / self.rate if self._tokens < 0 else 0.0


class Pacer:
    """One host's emulated NIC (see the module docstring). ``burst``: the bytes the
    receiving side absorbs at once, at least one chunk frame."""

    def __init__(self, model: LinkModel, *, burst: int, rng: random.Random | None = None):
        self.model = model
        rate = model.gbps * 1e9 / 8
        self.egress = Line(rate) if rate else None
        self.ingress = Bucket(rate, max(burst, 64 << 10)) if rate else None
        self.one_way = model.rtt_ms / 2000
        self._rng = rng or random.Random()

    @classmethod
    def of(cls, model: LinkModel | None, *, chunk: int) -> Pacer | None:
        """A host's NIC for ``model`` (None when it paces nothing), its ingress one frame of a
        ``chunk``-byte payload deep."""
        if model is None or not model.active:
            return None
        return cls(model, burst=chunk + FRAME_OVERHEAD)

    def send_delay(self, nbytes: int) -> float:
        """Seconds to hold a frame of ``nbytes`` before it goes to the socket: its turn on
        the line, half the round trip, and what its lost segments cost."""
        delay = self.one_way
        if self.egress is not None:
            delay += self.egress.reserve(nbytes)
        if self.model.loss:
            delay += self._losses(nbytes)
        return delay

    async def before_send(self, nbytes: int) -> None:
        await hold(self.send_delay(nbytes))

    def received(self, nbytes: int) -> float:
        """Seconds the connection must stop reading after ``nbytes`` came in (0: none)."""
        return self.ingress.take(nbytes) if self.ingress is not None else 0.0

    def _losses(self, nbytes: int) -> float:
        p, rtt = self.model.loss, self.model.rtt_ms / 1000
        segments = max(1, math.ceil(nbytes / SEGMENT))
        tail = min(TAIL_SEGMENTS, segments)
        body = segments - tail
        cost = 0.0
        # Body losses: a binomial draw, by its normal approximation when the frame is big.
        if body:
            mean = body * p
            if body > 1000:
                lost = max(0, round(self._rng.gauss(mean, math.sqrt(mean * (1 - p)))))
            else:
                lost = sum(self._rng.random() < p for _ in range(body))
            cost += lost * max(rtt, MIN_RETRANSMIT)
        if self._rng.random() < 1 - (1 - p) ** tail:
            cost += max(MIN_RTO, rtt)
        return cost


class ReadGate:
    """Holds a connection's reading while its host's ingress bucket is dry. ``may_resume()``
    says whether the connection has no reason of its own to stay paused (backpressure)."""

    def __init__(self, pacer: Pacer | None, may_resume: Callable[[], bool]) -> None:
        self.pacer = pacer
        self.may_resume = may_resume
        self.held = False

    def received(self, nbytes: int, transport: asyncio.Transport | None) -> None:
        """``nbytes`` came in on ``transport``: pause its reading as long as the NIC says."""
        if self.pacer is None or transport is None:
            return
        wait = self.pacer.received(nbytes)
        if wait <= 0 or self.held:
            return
        self.held = True
        transport.pause_reading()
        asyncio.get_running_loop().call_later(wait, self._release, transport)

    def _release(self, transport: asyncio.Transport) -> None:
        self.held = False
        if self.may_resume() and not transport.is_closing():
            transport.resume_reading()


__all__ = ["Bucket", "Line", "LinkModel", "Pacer", "ReadGate", "hold"]
