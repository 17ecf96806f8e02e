"""Where a block's chunks go: live nodes, distinct nodes and failure domains first.

``Placement`` picks ``(node, disk)`` targets for a block's chunks, runs the hedged reservation
race (reserve on more nodes than needed, keep the first to accept) and finds a replacement for
a chunk whose write failed. It only asks nodes whether they are up and whether they take a
chunk (``reserve``); it never moves chunk bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import random
from collections import Counter
from collections.abc import Collection, Iterable, Sequence

from tectonic_emu.chunkstore.base import StorageNode
from tectonic_emu.coding import Encoding
from tectonic_emu.errors import NoSpaceError, NotEnoughNodesError

Target = tuple[int, int]  # (node id, disk)


def is_full(exc: BaseException) -> bool:
    """Whether an error says the node has no room (ENOSPC, EDQUOT)."""
    return getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT)


def min_live_nodes(enc: Encoding, margin: int = 1) -> int:
    """The fewest chunks (so distinct live nodes, with one disk each) a block of ``enc`` is
    written and acknowledged with: ``margin`` beyond the chunks a read needs (data chunks + 1
    for RS, 2 for r3, at most the width; r1: 1).

    With every node up, a block gets all its chunks, on distinct nodes. With some down, a
    write still goes through with fewer (or with two chunks sharing a node, on distinct
    disks) as long as losing any ``margin`` more nodes keeps the block readable; such blocks
    count as below redundancy until repair completes them.
    """
    if enc.width <= 1:
        return 1
    return min(enc.width, enc.min_chunks + max(1, margin))


def spread_is_short(
    nodes: Sequence[int], domains: Sequence[str] | None, usable: Iterable[int] | None = None
) -> bool:
    """Whether a block's chunks on ``nodes`` crowd a failure domain (a host) more than they
    must: moving one chunk from the most crowded domain to a node of another domain that
    the block does not use (among ``usable`` nodes, default all) would leave that domain
    with fewer chunks than the crowded one had. Losing the crowded host would cost the block
    more chunks than it must, so the block counts as below redundancy. Without ``domains``
    every node is its own domain (two chunks on one node count elsewhere)."""
    if domains is None or not nodes:
        return False
    count = Counter(domains[n] for n in nodes)
    top = max(count.values())
    used = set(nodes)
    pool = range(len(domains)) if usable is None else usable
    free = {domains[n] for n in pool if n not in used}
    return any(count.get(d, 0) + 1 < top for d in free)


class Placement:
    """Chunk targets on one cluster's nodes.

    ``domains``: each node's failure domain (its host, in a cluster across hosts); a block's
    chunks go to distinct domains first. None: every node is its own. ``rng`` drives every
    random choice (shared with the reads' replica order, so one seed fixes a run).
    """

    def __init__(
        self,
        nodes: Sequence[StorageNode],
        *,
        disks_per_node: int,
        domains: Sequence[str] | None,
        rng: random.Random,
    ) -> None:
        self.nodes = nodes
        self.domains = list(domains) if domains is not None else None
        if self.domains is not None and len(self.domains) != len(nodes):
            raise ValueError(f"{len(self.domains)} failure domains for {len(nodes)} nodes")
        self.disks_per_node = disks_per_node
        self._rng = rng
        # Chunks beyond a read's need that a degraded write must still place (min_live_nodes).
        self.write_margin = 1

    def min_write_chunks(self, enc: Encoding) -> int:
        """The fewest chunks a block of ``enc`` is written with (``min_live_nodes``)."""
        return min_live_nodes(enc, self.write_margin)

    def live_nodes(self) -> list[int]:
        return [n.node_id for n in self.nodes if n.available]

    def live_up_to(self, cap: int) -> int:
        """How many nodes are live, counted up to ``cap``: one look at each node only until
        ``cap`` live ones are found (a few, when most are up), not a walk of all of them."""
        found = 0
        for node in self.nodes:
            if found >= cap:
                break
            found += node.available
        return found

    def _sample_live(self, count: int, avoid: set[int]) -> list[int] | None:
        """``count`` distinct live nodes outside ``avoid``, drawn uniformly without walking
        every node (as a shuffle of the live ones would, which costs milliseconds per block
        with thousands of nodes). None when the draws keep meeting dead or avoided nodes:
        the caller then walks them all."""
        chosen: list[int] = []
        seen = set(avoid)
        for _ in range(4 * count + 16):
            if len(chosen) == count:
                return chosen
            node = self.nodes[self._rng.randrange(len(self.nodes))]
            if node.node_id not in seen:
                seen.add(node.node_id)
                if node.available:
                    chosen.append(node.node_id)
        return chosen if len(chosen) == count else None

    def place(
        self,
        enc: Encoding,
        count: int,
        *,
        avoid: Iterable[int] = (),
        at_least: int | None = None,
    ) -> list[Target]:
        """``count`` (node, disk) targets on live nodes, distinct nodes first, and with
        ``domains``, distinct domains before a second node of any one domain. ``at_least``: as
        few as that many are fine when the live nodes cannot take ``count`` (a degraded write).

        Raises NotEnoughNodesError when the live nodes cannot hold the block safely (the line
        names how many chunks could be placed and how many were needed).
        """
        avoid_set = set(avoid)
        if self.domains is None and 8 * (count + len(avoid_set)) <= len(self.nodes):
            # Many nodes, few wanted: draw them (the same distribution as the walk below:
            # distinct live nodes in random order, each on a random disk).
            picked = self._sample_live(count, avoid_set)
            least = self.min_write_chunks(enc)
            if picked is not None and self.live_up_to(least) >= least:
                return [(n, self._rng.randrange(self.disks_per_node)) for n in picked]
        all_live = self.live_nodes()
        live = [n for n in all_live if n not in avoid_set]
        self._rng.shuffle(live)
        if self.domains is not None:
            live = self._across_domains(live)
        up = len(all_live)
        least = self.min_write_chunks(enc)
        if up < least:
            raise NotEnoughNodesError(
                f"encoding {enc} needs {least} live nodes to write a block; "
                f"{up} of {len(self.nodes)} are up"
            )
        room = len(live) * self.disks_per_node
        if room < count:
            if at_least is None or room < at_least:
                need = count if at_least is None else at_least
                raise NotEnoughNodesError(
                    f"encoding {enc}: {len(live)} usable live nodes can take {room} chunks, "
                    f"{need} needed ({up} of {len(self.nodes)} nodes are up)"
                )
            count = room  # degraded: the block is below redundancy until repair
        targets: list[Target] = []
        disk_of = {n: self._rng.randrange(self.disks_per_node) for n in live}
        while len(targets) < count:
            for n in live:
                if len(targets) == count:
                    break
                targets.append((n, disk_of[n]))
                disk_of[n] = (disk_of[n] + 1) % self.disks_per_node
        return targets

    async def reserve(self, enc: Encoding, nbytes: int, extra: int) -> list[Target]:
        """``enc.width`` targets on distinct nodes: the first to accept a reservation of
        ``nbytes`` among ``extra`` (> 0) more candidates than needed. With failure domains, the
        race goes on until the accepted targets span as many domains as the candidates that
        have not failed can (or every answer is in). Too few accepted: the rest are filled as
        a failed chunk write would be (``replacement``)."""
        candidates = self.place(enc, enc.width + extra)
        asks = {asyncio.ensure_future(self.nodes[n].reserve(nbytes)): (n, d) for n, d in candidates}
        accepted: list[Target] = []
        failed: set[int] = set()
        full: set[int] = set()
        pending = set(asks)
        try:
            while pending and not self._enough(accepted, candidates, failed, enc.width):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                # In candidate order, not the sets' (which follows memory addresses), so that
                # answers at one moment are taken in the same order on every run.
                for ask in [a for a in asks if a in done]:
                    exc = ask.exception()
                    if exc is None:
                        accepted.append(asks[ask])
                    elif isinstance(exc, OSError):
                        failed.add(asks[ask][0])
                        if is_full(exc):
                            full.add(asks[ask][0])
                    else:
                        raise exc
        finally:
            for ask in pending:
                ask.cancel()
        accepted = self._spread(accepted)
        taken = set(accepted)
        while len(accepted) < enc.width:
            target = self.replacement(enc, taken, failed, full)
            taken.add(target)
            accepted.append(target)
        return accepted[: enc.width]

    def replacement(
        self,
        enc: Encoding,
        taken: set[Target],
        failed: set[int],
        full: Collection[int] = (),
    ) -> Target:
        """A target for a chunk whose node failed: a live node the block does not use yet,
        else (as a degraded write does) a free disk of a node it uses; the block is then below
        redundancy until repair moves it. Raises NoSpaceError when none is left and some of
        the ``failed`` nodes are ``full``, NotEnoughNodesError when none is left otherwise."""
        used = {n for n, _ in taken}
        with contextlib.suppress(NotEnoughNodesError):
            ((node, disk),) = self.place(enc, 1, avoid=used | failed)
            return node, disk
        for n in self.live_nodes():
            if n in failed:
                continue
            for d in range(self.disks_per_node):
                if (n, d) not in taken:
                    return n, d
        if full:
            raise NoSpaceError(
                f"encoding {enc}: no room left for a chunk (nodes {sorted(full)} are full, "
                f"{len(failed)} failed, {len(self.live_nodes())} of {len(self.nodes)} up)"
            )
        raise NotEnoughNodesError(
            f"encoding {enc}: no live node left to take a chunk that failed to write "
            f"({len(failed)} nodes failed, {len(self.live_nodes())} of {len(self.nodes)} up)"
        )

    # -- failure domains ---------------------------------------------------------------------
    def _across_domains(self, nodes: list[int]) -> list[int]:
        """``nodes`` (shuffled) reordered to take one node of each domain in turn."""
        assert self.domains is not None
        by_domain: dict[str, list[int]] = {}
        for n in nodes:
            by_domain.setdefault(self.domains[n], []).append(n)
        rows = list(by_domain.values())
        return [n for turn in itertools.zip_longest(*rows) for n in turn if n is not None]

    def _spread(self, targets: list[Target]) -> list[Target]:
        """``targets`` in order, one per failure domain in turn (as ``place`` orders them)."""
        if self.domains is None:
            return targets
        order = self._across_domains([n for n, _ in targets])
        disk = dict(targets)
        return [(n, disk[n]) for n in order]

    def _enough(
        self,
        accepted: list[Target],
        candidates: list[Target],
        failed: set[int],
        width: int,
    ) -> bool:
        if len(accepted) < width:
            return False
        if self.domains is None:
            return True
        domains = self.domains
        have = {domains[n] for n, _ in self._spread(accepted)[:width]}
        could = {domains[n] for n, _ in candidates if n not in failed}
        return len(have) >= min(width, len(could))


__all__ = ["Placement", "Target", "is_full", "min_live_nodes", "spread_is_short"]
