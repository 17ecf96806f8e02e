"""What hedging counts, and when a chunk read is late or a node slow.

``HedgeStats`` counts hedged writes and reads for the whole data path. ``ReadHedging`` keeps
the latency of recent chunk reads: per size class (the hedge delay is their
``hedge_percentile``) and per node (a node none of whose recent reads was fast is read around
for a while). The read path (``blockread.py``) asks it when to race and whom to avoid.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

from tectonic_emu import clock

log = logging.getLogger("tectonic_emu.datapath")

# Latency samples kept per chunk-size class, and how many before reads start hedging.
_LATENCY_SAMPLES = 256
_MIN_SAMPLES = 20
_NODE_SAMPLES = 4  # per node and size class, for slow-node detection
# Up to this many nodes with full windows of a size class, a read's node is compared with
# the others' median exactly; beyond, with a median of all of them refreshed every
# _MEDIAN_EVERY reads of the class (one node among hundreds barely moves it, and a fresh one
# per read cost a walk of every node's window per chunk read: O(nodes) at 7,500 nodes).
_EXACT_NODES = 64
_MEDIAN_EVERY = 256
# Before that, a chunk read this slow is raced anyway (a cold client meeting a stuck node).
DEFAULT_HEDGE_AFTER = 1.0
# Over the hedge share, a read still hedges once it is this many times the hedge delay late.
STUCK_FACTOR = 10.0
# A node whose fastest read of its last _NODE_SAMPLES (of a size class) took over SLOW_FACTOR
# times the median of the other nodes' fastest reads plus SLOW_MIN seconds, or caught stuck
# (a read STUCK_FACTOR times late), is read around for SLOW_NODE_PENALTY seconds: replicas elsewhere
# first, parity in place of its chunks in whole-block reads (as many reads, one rebuild), so a
# wrong guess costs a little CPU, never extra I/O. Minimums, not medians: queueing and cold
# reads make any node's median swing 2-3x, but leave some of its reads fast, while a node that
# delays everything has no fast read left.
SLOW_FACTOR = 2.0
SLOW_MIN = 0.02
SLOW_NODE_PENALTY = 10.0


@dataclass(slots=True)
class HedgeStats:
    reads: int = 0  # chunk-read operations (a block or range read)
    hedged_reads: int = 0  # of which raced a second replica or a decode, on tail latency
    slow_node_reads: int = 0  # whole-block reads that read parity around a node marked slow
    slow_nodes_marked: int = 0  # times a node was found slow (stuck, or slow for a while)
    writes: int = 0
    hedged_writes: int = 0  # reserved on more nodes than needed
    stragglers: int = 0  # chunk writes left running after the block was acknowledged
    straggler_failures: int = 0  # of which failed (repair rebuilds those chunks)


class ReadHedging:
    """Read latencies and slow-node marks of one data path, and its read-hedging settings.

    ``percentile``: reads slower than this percentile of their size class are late.
    ``share``: at most this share of reads may hedge. ``enabled`` False: reads never race
    (no tail hedges, no stuck or slow nodes), for comparisons.
    """

    def __init__(
        self, stats: HedgeStats, *, percentile: float, share: float, enabled: bool
    ) -> None:
        self.stats = stats
        self.percentile = percentile
        self.share = share
        self.enabled = enabled
        # Nodes whose chunk reads had to be hedged: read last until this clock.monotonic().
        self._slow_until: dict[int, float] = {}
        self._node_latency: dict[tuple[int, int], collections.deque[float]] = {}
        self._latency: dict[int, collections.deque[float]] = {}
        self._full: dict[int, set[int]] = {}  # per size class: nodes with a full window
        self._median: dict[int, tuple[float, int]] = {}  # per class: (median, reads left)

    def record(self, node: int, size: int, seconds: float) -> None:
        """One chunk read's latency, for the hedge delay of its size class and for the
        node's own record: a node none of whose recent reads was fast is marked slow (a
        persistently slow node fills the tail percentile itself, so the percentile alone
        stops flagging it)."""
        size_class = size.bit_length()
        samples = self._latency.get(size_class)
        if samples is None:
            samples = self._latency[size_class] = collections.deque(maxlen=_LATENCY_SAMPLES)
        samples.append(seconds)
        mine = self._node_latency.get((node, size_class))
        if mine is None:
            mine = self._node_latency[(node, size_class)] = collections.deque(maxlen=_NODE_SAMPLES)
        mine.append(seconds)
        if len(mine) < _NODE_SAMPLES:
            return  # judge a node on a full window only: first reads include connecting
        full = self._full.setdefault(size_class, set())
        full.add(node)
        fastest = min(mine)
        # Even its fastest recent read is well over what the other nodes' fastest reads take:
        # a delay the node adds to everything. Queueing (in the client, the network, the
        # disks) raises every node's fastest read alike and leaves the comparison alone.
        if len(full) <= _EXACT_NODES:
            if fastest <= SLOW_MIN:
                return  # under any threshold: no walk of the others' windows needed
            others = sorted(min(self._node_latency[(n, size_class)]) for n in full if n != node)
            if len(others) < 3:
                return
            median = others[len(others) // 2]
        else:
            median = self._median_of(size_class, full)
        if fastest > SLOW_FACTOR * median + SLOW_MIN:
            self.mark_slow(node)

    def _median_of(self, size_class: int, full: set[int]) -> float:
        """The median of every full window's fastest read in ``size_class``, kept for
        ``_MEDIAN_EVERY`` reads."""
        cached = self._median.get(size_class)
        if cached is not None and cached[1] > 0:
            self._median[size_class] = (cached[0], cached[1] - 1)
            return cached[0]
        fastest = sorted(min(self._node_latency[(n, size_class)]) for n in full)
        median = fastest[len(fastest) // 2]
        self._median[size_class] = (median, _MEDIAN_EVERY)
        return median

    def is_slow(self, node: int, now: float | None = None) -> bool:
        """Marked slow lately (and read hedging is on)."""
        if not self.enabled:
            return False
        return self._slow_until.get(node, 0.0) > (clock.monotonic() if now is None else now)

    def mark_slow(self, node: int) -> None:
        if not self.enabled:
            return
        now = clock.monotonic()
        if self._slow_until.get(node, 0.0) <= now:
            self.stats.slow_nodes_marked += 1
            log.info("node %d reads slowly: read around for %.0f s", node, SLOW_NODE_PENALTY)
        self._slow_until[node] = now + SLOW_NODE_PENALTY

    def hedge_after(self, size: int) -> float:
        """Seconds after which a read of a chunk of ``size`` bytes is slow: the
        ``percentile`` of recent reads of chunks of that size class, or
        ``DEFAULT_HEDGE_AFTER`` until there are enough of them)."""
        samples = self._latency.get(size.bit_length())
        if samples is None or len(samples) < _MIN_SAMPLES:
            return DEFAULT_HEDGE_AFTER
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(len(ordered) * self.percentile / 100))]

    def may_hedge(self) -> bool:
        """Whether one more read may hedge within the hedge share."""
        return self.stats.hedged_reads < self.share * self.stats.reads

    def count_read(self) -> None:
        self.stats.reads += 1
        if self.stats.reads >= 10_000:  # a sliding share: old reads weigh less
            self.stats.reads //= 2
            self.stats.hedged_reads //= 2


__all__ = [
    "DEFAULT_HEDGE_AFTER",
    "SLOW_FACTOR",
    "SLOW_MIN",
    "SLOW_NODE_PENALTY",
    "STUCK_FACTOR",
    "HedgeStats",
    "ReadHedging",
]
