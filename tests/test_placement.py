"""Placement at scale (``tectonic_emu/placement.py``): with thousands of nodes a block's
targets are drawn, not found by walking every node, and the draw keeps the walk's promises:
distinct live nodes, none avoided, spread evenly, and the walk's answer when too many are
down to draw from."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu.coding import Encoding
from tectonic_emu.errors import NotEnoughNodesError
from tectonic_emu.placement import Placement


@dataclass
class Stub:
    """What placement reads of a node."""

    node_id: int
    available: bool = True


def placement(n: int, *, seed: int = 1, disks: int = 4) -> tuple[Placement, list[Stub]]:
    nodes = [Stub(i) for i in range(n)]
    return Placement(nodes, disks_per_node=disks, domains=None, rng=random.Random(seed)), nodes  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    down=st.sets(st.integers(0, 1999), max_size=1500),
    avoid=st.sets(st.integers(0, 1999), max_size=20),
    enc=st.sampled_from(["r3", "rs-6-3", "rs-9-6"]),
    seed=st.integers(0, 1000),
)
def test_targets_are_distinct_live_nodes_outside_avoid(
    down: set[int], avoid: set[int], enc: str, seed: int
) -> None:
    p, nodes = placement(2000, seed=seed)
    for n in down:
        nodes[n].available = False
    e = Encoding.parse(enc)
    targets = p.place(e, e.width, avoid=avoid)
    picked = [n for n, _ in targets]
    assert len(set(picked)) == len(picked) == e.width
    assert not set(picked) & (down | avoid)
    assert all(0 <= d < 4 for _, d in targets)


def test_draws_spread_over_every_node_and_disk() -> None:
    p, _ = placement(3000, disks=2)
    enc = Encoding.parse("rs-9-6")
    counts: Counter[tuple[int, int]] = Counter()
    for _ in range(4000):  # 60,000 chunks: 10 per (node, disk) on average
        counts.update(p.place(enc, enc.width))
    assert len(counts) > 0.99 * 6000  # nearly every (node, disk) got some
    assert max(counts.values()) < 35  # and none far more than its share


def test_with_most_nodes_down_the_walk_decides() -> None:
    """9 live nodes of 2,000: the draws give up, the walk finds all nine; with 8 left, an
    rs-6-3 block still gets its 9 targets, two on one node's disks (a degraded write), and
    with 6 the error names the minimum, as on a small cluster."""
    p, nodes = placement(2000)
    for node in nodes[9:]:
        node.available = False
    enc = Encoding.parse("rs-6-3")
    assert sorted(n for n, _ in p.place(enc, 9)) == list(range(9))
    nodes[0].available = False
    degraded = p.place(enc, 9, at_least=p.min_write_chunks(enc))
    assert len(degraded) == 9 and len({n for n, _ in degraded}) == 8  # two on one node
    for node in nodes[:3]:
        node.available = False
    with pytest.raises(NotEnoughNodesError, match="needs 7 live nodes"):
        p.place(enc, 9, at_least=7)
    assert p.live_up_to(5) == 5 and p.live_up_to(100) == 6
