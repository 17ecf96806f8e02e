"""TrafficGroups and the fair queue: shares by weight, lent when idle, no credit saved, FIFO
without QoS, cancellation, and the histograms behind the percentiles (all in virtual time)."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu import clock
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.qos import CLASSES, Costs, FairQueue, GroupStats, Histogram, TrafficGroup, using
from tectonic_emu.qos import current as current_group

# One byte costs one device-second: a request's cost is its size, easy to reason about.
UNIT = Costs(read_bw=1.0, write_bw=1.0, read_op_s=0.0, write_op_s=0.0)
GOLD, BRONZE = TrafficGroup("loader", "gold"), TrafficGroup("ckpt", "bronze")


async def _request(q: FairQueue, group: TrafficGroup, size: int, order: list[str]) -> None:
    async with q.serving(group, size, write=True):
        order.append(group.name)
        await asyncio.sleep(size)


async def _backlogged(q: FairQueue, sizes: dict[TrafficGroup, int], n: int) -> list[str]:
    """Every group submits ``n`` requests at once; the order they got slots in."""
    order: list[str] = []
    async with asyncio.TaskGroup() as tg:
        for g, size in sizes.items():
            for _ in range(n):
                tg.create_task(_request(q, g, size, order))
    return order


def test_backlogged_groups_share_by_weight() -> None:
    q = FairQueue(1, costs=UNIT)
    order = clock.run_virtual(_backlogged(q, {GOLD: 1, BRONZE: 1}, 200))
    # While both have work, gold gets 16 slots for each of bronze's.
    first = order[: 17 * 10]
    assert first.count("loader") == 160 and first.count("ckpt") == 10
    assert q.busy == 0 and q.waiting == 0


def test_shares_are_in_disk_time_not_requests() -> None:
    """Bronze's requests are 16 times gold's: the two get equal time, not equal requests,
    when their weights are equal."""
    a, b = TrafficGroup("small", "silver"), TrafficGroup("big", "silver")
    q = FairQueue(1, costs=UNIT)
    order = clock.run_virtual(_backlogged(q, {a: 1, b: 16}, 64))
    first = order[:34]
    assert abs(first.count("small") - 32) <= 1 and abs(first.count("big") - 2) <= 1


def test_idle_share_is_lent_and_no_credit_is_saved() -> None:
    async def main() -> tuple[float, list[str]]:
        q = FairQueue(2, costs=UNIT)
        order: list[str] = []  # not looked at
        t0 = clock.monotonic()
        # Bronze alone: it has every slot (2 at once), so 40 unit requests take 20 s.
        async with asyncio.TaskGroup() as tg:
            for _ in range(40):
                tg.create_task(_request(q, BRONZE, 1, order))
        alone = clock.monotonic() - t0
        # Gold idle all that while comes back with no saved credit: beside a backlogged
        # bronze it gets its 16/17, not everything until it has caught up.
        return alone, await _backlogged(q, {GOLD: 1, BRONZE: 1}, 40)

    alone, order = clock.run_virtual(main())
    assert alone == pytest.approx(20.0)
    assert 1 <= order[:34].count("ckpt") <= 3


def test_without_fairness_it_is_first_come_first_served() -> None:
    async def main() -> list[str]:
        q = FairQueue(1, costs=UNIT, fair=False)
        order: list[str] = []
        async with asyncio.TaskGroup() as tg:
            for i in range(30):
                g = BRONZE if i < 20 else GOLD
                tg.create_task(_request(q, g, 1, order))
                await asyncio.sleep(0)  # arrive in this order
        return order

    order = clock.run_virtual(main())
    assert order == ["ckpt"] * 20 + ["loader"] * 10


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.5, 1.0, 3.0]), min_size=2, max_size=4),
    sizes=st.lists(st.integers(1, 8), min_size=4, max_size=4),
    seed=st.integers(0, 1000),
)
def test_sfq_fairness_bound(weights: list[float], sizes: list[int], seed: int) -> None:
    """Start-time fair queueing's bound: over any interval in which two groups are both
    backlogged, the service each got per unit weight differs by at most the largest
    request of each over its weight (one server)."""
    groups = [TrafficGroup(f"g{i}", "silver", w) for i, w in enumerate(weights)]
    rng = random.Random(seed)
    served: list[tuple[str, float]] = []

    async def one(q: FairQueue, g: TrafficGroup, size: int) -> None:
        async with q.serving(g, size, write=False):
            served.append((g.name, size))
            await asyncio.sleep(size)

    async def main() -> None:
        q = FairQueue(1, costs=UNIT)
        async with asyncio.TaskGroup() as tg:
            for i, g in enumerate(groups):
                for _ in range(60):
                    tg.create_task(one(q, g, rng.randint(1, sizes[i])))

    clock.run_virtual(main())
    # Every group is backlogged until its first run-out; check the prefix before that.
    counts = {g.name: 0 for g in groups}
    work = {g.name: 0.0 for g in groups}
    for name, size in served:
        counts[name] += 1
        if counts[name] == 60:
            break
        work[name] += size
    for i, a in enumerate(groups):
        for b in groups[i + 1 :]:
            bound = sizes[int(a.name[1:])] / a.weight + sizes[int(b.name[1:])] / b.weight
            assert abs(work[a.name] / a.weight - work[b.name] / b.weight) <= bound + 1e-9


@settings(max_examples=40, deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.sampled_from([GOLD, BRONZE]), st.integers(1, 5), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    depth=st.integers(1, 4),
)
def test_cancelled_waits_leak_no_slot(
    plan: list[tuple[TrafficGroup, int, bool]], depth: int
) -> None:
    """Requests cancelled while they wait (or just as their slot comes) never leave a slot
    held; the others all run, never more than ``depth`` at once."""
    most = 0

    async def main() -> FairQueue:
        nonlocal most
        q = FairQueue(depth, costs=UNIT)
        running = 0

        async def one(g: TrafficGroup, size: int) -> None:
            nonlocal running, most
            async with q.serving(g, size, write=True):
                running += 1
                most = max(most, running)
                try:
                    await asyncio.sleep(size)
                finally:
                    running -= 1

        tasks = [asyncio.ensure_future(one(g, size)) for g, size, _ in plan]
        await asyncio.sleep(0.5)
        for t, (_, _, cancel) in zip(tasks, plan, strict=True):
            if cancel:
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return q

    q = clock.run_virtual(main())
    assert q.busy == 0 and q.waiting == 0 and most <= depth
    done = sum(s.ops for s in q.stats.values())
    assert done >= sum(1 for *_, cancel in plan if not cancel)


def test_unknown_sizes_are_charged_once_known() -> None:
    """A whole-chunk read's size is set by the body; the group's tag moves by its true cost,
    so a group reading big chunks unannounced still gets only its share."""

    async def reads(q: FairQueue, g: TrafficGroup, size: int, order: list[str]) -> None:
        async with q.serving(g, None, write=False) as ticket:
            ticket.nbytes = size
            order.append(g.name)
            await asyncio.sleep(size)

    async def main() -> list[str]:
        q = FairQueue(1, costs=UNIT)
        a, b = TrafficGroup("a", "silver"), TrafficGroup("b", "silver")
        order: list[str] = []
        async with asyncio.TaskGroup() as tg:
            for _ in range(40):
                tg.create_task(reads(q, a, 4, order))
                tg.create_task(_request(q, b, 1, order))
        return order

    order = clock.run_virtual(main())
    # Equal weights, a's reads four times b's requests: about four of b's per one of a's.
    assert 5 <= order[:40].count("a") <= 11


def test_stats_count_each_group() -> None:
    q = FairQueue(1, costs=UNIT)
    clock.run_virtual(_backlogged(q, {GOLD: 2, BRONZE: 1}, 5))
    gold, bronze = q.stats["loader"], q.stats["ckpt"]
    assert (gold.ops, gold.bytes, gold.klass) == (5, 10, "gold")
    assert (bronze.ops, bronze.bytes, bronze.charged_s) == (5, 5, 5.0)
    assert gold.busy_s == pytest.approx(10.0)
    assert gold.latency.n == 5 and gold.wait.quantile(0.0) == 0.0
    again = GroupStats.from_dict(gold.to_dict())
    assert again.summary() == gold.summary()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1e-6, 50.0), min_size=1, max_size=200), st.floats(0.01, 0.99))
def test_histogram_quantiles_are_within_a_bucket(samples: list[float], q: float) -> None:
    h = Histogram()
    for s in samples:
        h.add(s)
    got = h.quantile(q)
    ordered = sorted(samples)
    lo = ordered[max(0, int(q * len(ordered)) - 1)]
    hi = ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    assert lo / 2**0.5 - 1e-5 <= got <= hi * 2**0.5 + 1e-5
    assert Histogram.from_dict(h.to_dict()).quantile(q) == got


def test_groups_are_checked_and_travel() -> None:
    g = TrafficGroup.parse("ckpt:bronze:2:5e8")
    assert (g.name, g.klass, g.share, g.rate) == ("ckpt", "bronze", 2.0, 5e8)
    assert g.weight == 2 * CLASSES["bronze"]
    back = TrafficGroup.decode(g.encode())
    assert (back.name, back.klass, back.share) == ("ckpt", "bronze", 2.0)
    for bad in ("", "Loader", "a:platinum", "a:gold:0", "a:gold:x", "a:gold:1:-1", "a:b:c:d:e"):
        with pytest.raises(InvalidArgumentError):
            TrafficGroup.parse(bad)
    with pytest.raises(InvalidArgumentError):
        TrafficGroup.decode(b"\xff:gold:1")
    with pytest.raises(InvalidArgumentError):
        FairQueue(0)


def test_the_group_is_inherited_by_tasks() -> None:
    async def main() -> list[str]:
        seen: list[str] = []

        async def child() -> None:
            seen.append(current_group().name)

        with using(GOLD):
            await asyncio.create_task(child())
        await asyncio.create_task(child())
        with using(None):
            seen.append(current_group().name)
        return seen

    assert clock.run_virtual(main()) == ["loader", "default", "default"]


def test_pacing_holds_a_group_to_its_rate_and_leaves_others_alone() -> None:
    """A paced group's blocks go at its rate after a burst of ``BURST_S`` of it; a group
    without a rate, or outside any ``using``, waits for nothing."""
    from tectonic_emu.qos.pacing import BURST_S, Pacing

    async def main() -> tuple[float, float, float]:
        pacing = Pacing()
        slow = TrafficGroup("ckpt", "bronze", rate=100.0)
        t0 = clock.monotonic()
        with using(slow):
            await asyncio.gather(*(pacing.take(10) for _ in range(50)))  # 500 bytes
        paced = clock.monotonic() - t0
        t1 = clock.monotonic()
        with using(GOLD):
            await asyncio.gather(*(pacing.take(10**9) for _ in range(5)))
        await pacing.take(10**9)
        return paced, clock.monotonic() - t1, pacing.waited_s

    paced, unpaced, waited = clock.run_virtual(main())
    assert paced == pytest.approx(500 / 100.0 - BURST_S)
    assert unpaced == 0.0 and waited > 0
