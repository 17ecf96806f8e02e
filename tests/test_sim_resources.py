"""Modelled resources (``tectonic_emu/sim/resources.py``) in virtual time: one contract for
both disciplines, processor sharing against a simple step-by-step model, first come first
served against its booking arithmetic, and the analytic cases of issue 20."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu import clock
from tectonic_emu.sim.resources import QueueResource, Resource, SharedResource, use_all

GB = 1e9
Make = Callable[[float], Resource]
KINDS: dict[str, Make] = {"shared": SharedResource, "queue": QueueResource}

jobs_strategy = st.lists(
    st.tuples(st.floats(0, 5), st.floats(1e-3, 1e3)),  # (arrival, amount)
    min_size=1,
    max_size=25,
)


def ends(
    make: Make, rate: float, jobs: list[tuple[float, float]], came: list[int] | None = None
) -> list[float]:
    """When each job (arrival, amount) ends on a fresh resource, in virtual time; ``came``
    gets the order they reached it (the loop's order among equal arrival times)."""
    came = [] if came is None else came

    async def main() -> list[float]:
        r = make(rate)
        out = [0.0] * len(jobs)

        async def one(k: int, at: float, amount: float) -> None:
            await asyncio.sleep(at)
            came.append(k)
            await r.use(amount)
            out[k] = clock.monotonic()

        await asyncio.gather(*(one(k, a, n) for k, (a, n) in enumerate(jobs)))
        assert r.jobs == sum(n > 0 for _, n in jobs)
        assert r.served == pytest.approx(sum(n for _, n in jobs))
        return out

    return clock.run_virtual(main())


@pytest.fixture(params=sorted(KINDS))
def make(request: pytest.FixtureRequest) -> Make:
    return KINDS[request.param]


# -- the contract ----------------------------------------------------------------------------
def test_one_job_takes_its_amount_over_the_rate(make: Make) -> None:
    """Issue 20: one flow over a 1 GB/s link takes size / 1 GB/s (here to a part in 1e9)."""
    assert ends(make, 1 * GB, [(0.0, 3 * GB)]) == [pytest.approx(3.0, rel=1e-9)]
    assert ends(make, 1 * GB, [(2.0, 0.0)]) == [2.0]  # nothing to serve: at once


@settings(max_examples=60, deadline=None)
@given(jobs=jobs_strategy, rate=st.floats(0.1, 100))
def test_no_job_beats_the_rate_and_no_capacity_is_left_idle(
    jobs: list[tuple[float, float]], rate: float
) -> None:
    """For both: each job ends no sooner than its amount / rate after it came, and the last
    ends exactly when a resource that never idles with work waiting would end (the
    work-conserving makespan: arrivals in order, each busy stretch at full rate)."""
    order = sorted(jobs)
    free = 0.0
    for at, amount in order:
        free = max(free, at) + amount / rate
    for kind, make in KINDS.items():
        got = ends(make, rate, jobs)
        for (at, amount), end in zip(jobs, got, strict=True):
            assert end >= at + amount / rate * (1 - 1e-9), kind
        assert max(got) == pytest.approx(free, rel=1e-9), kind


def test_the_same_jobs_end_at_the_same_times(make: Make) -> None:
    jobs = [(k * 0.1 % 0.7, 1.0 + k % 3) for k in range(40)]
    assert ends(make, 7.0, jobs) == ends(make, 7.0, jobs)


def test_bad_rates_and_amounts_are_refused(make: Make) -> None:
    for rate in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            make(rate)

    async def main() -> None:
        r = make(1.0)
        for amount in (-1.0, float("inf"), float("nan")):
            with pytest.raises(ValueError):
                await r.use(amount)

    clock.run_virtual(main())


def test_utilisation_is_the_share_of_capacity_served(make: Make) -> None:
    async def main() -> float:
        r = make(2.0)
        await r.use(3.0)  # 1.5 s
        await asyncio.sleep(1.5)
        return r.utilisation(clock.monotonic())

    assert clock.run_virtual(main()) == pytest.approx(0.5)


# -- processor sharing -----------------------------------------------------------------------
def shared_model(rate: float, jobs: list[tuple[float, float]]) -> list[float]:
    """Processor sharing step by step: between two events (an arrival or an end) every job
    present gets rate / n."""
    left = {k: n for k, (_, n) in enumerate(jobs)}
    arrivals = sorted(range(len(jobs)), key=lambda k: (jobs[k][0], k))
    present: list[int] = []
    out = [0.0] * len(jobs)
    now, i = 0.0, 0
    while i < len(arrivals) or present:
        next_arrival = jobs[arrivals[i]][0] if i < len(arrivals) else float("inf")
        if present:
            share = rate / len(present)
            first = min(present, key=lambda k: left[k])
            next_end = now + left[first] / share
        else:
            next_end = float("inf")
        step = min(next_arrival, next_end) - now
        for k in present:
            left[k] -= step * share if present else 0
        now += step
        if next_end <= next_arrival:
            done = [k for k in present if left[k] <= 1e-9 * jobs[k][1]]
            for k in done:
                present.remove(k)
                out[k] = now
        else:
            present.append(arrivals[i])
            i += 1
    return out


@settings(max_examples=80, deadline=None)
@given(jobs=jobs_strategy, rate=st.floats(0.1, 100))
def test_processor_sharing_matches_the_step_by_step_model(
    jobs: list[tuple[float, float]], rate: float
) -> None:
    want = shared_model(rate, jobs)
    assert ends(SharedResource, rate, jobs) == pytest.approx(want, rel=1e-7, abs=1e-9)


def test_two_flows_share_a_link() -> None:
    """Issue 20: two 1 GB flows on a 1 GB/s link both end at 2 s; a 1 GB flow beside a 3 GB
    one ends at 2 s, the other at 4 s."""
    assert ends(SharedResource, GB, [(0, GB), (0, GB)]) == pytest.approx([2.0, 2.0])
    assert ends(SharedResource, GB, [(0, GB), (0, 3 * GB)]) == pytest.approx([2.0, 4.0])


def test_a_withdrawn_job_stops_taking_its_share() -> None:
    """Two 1 GB flows at 1 GB/s; one is cancelled at 0.5 s, having had 0.25 GB: the other has
    0.75 GB left at the full rate and ends at 1.25 s."""

    async def main() -> float:
        link = SharedResource(GB)
        other = asyncio.ensure_future(link.use(GB))
        gone = asyncio.ensure_future(link.use(GB))
        await asyncio.sleep(0.5)
        gone.cancel()
        await other
        assert link.in_service == 0 and link.jobs == 1
        return clock.monotonic()

    assert clock.run_virtual(main()) == pytest.approx(1.25)


def test_a_transfer_over_several_hops_is_withdrawn_from_all() -> None:
    async def main() -> tuple[int, int]:
        a, b = SharedResource(1.0), SharedResource(1.0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(use_all([a.begin(5.0), b.begin(5.0)]), 1.0)
        await asyncio.sleep(0)
        return a.in_service, b.in_service

    assert clock.run_virtual(main()) == (0, 0)


# -- first come, first served ----------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(jobs=jobs_strategy, rate=st.floats(0.1, 100), servers=st.integers(1, 4))
def test_a_queue_serves_in_arrival_order_on_its_servers(
    jobs: list[tuple[float, float]], rate: float, servers: int
) -> None:
    """Each job, taken in the order it came, starts on the server free first, no sooner than
    it came, and holds it amount / rate."""

    def make(r: float) -> Resource:
        return QueueResource(r, servers=servers)

    came: list[int] = []
    got = ends(make, rate, jobs, came)
    assert [jobs[k][0] for k in came] == sorted(at for at, _ in jobs)
    free = [0.0] * servers
    want = [0.0] * len(jobs)
    for k in came:
        at, amount = jobs[k]
        s = min(range(servers), key=lambda s: free[s])
        free[s] = want[k] = max(at, free[s]) + amount / rate
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(jobs=jobs_strategy, rate=st.floats(0.1, 100), probe=st.floats(0, 20))
def test_served_so_far_counts_jobs_in_service_as_far_as_they_got(
    jobs: list[tuple[float, float]], rate: float, probe: float
) -> None:
    """What a shared resource has served by any moment is the rate times its busy time so
    far: it grows smoothly through jobs in service, not in steps at their ends."""

    async def main() -> float:
        r = SharedResource(rate)

        async def one(at: float, amount: float) -> None:
            await asyncio.sleep(at)
            await r.use(amount)

        tasks = [asyncio.ensure_future(one(a, n)) for a, n in jobs]
        await asyncio.sleep(probe)
        got = r.worth_so_far()  # worth: the amounts, none being given
        await asyncio.gather(*tasks)
        return got

    got = clock.run_virtual(main())
    free = busy = 0.0
    for at, amount in sorted(jobs):  # the busy time before ``probe``, as in the contract
        start = max(free, at)
        free = start + amount / rate
        busy += max(0.0, min(free, probe) - min(start, probe))
    assert got == pytest.approx(busy * rate, rel=1e-6, abs=1e-6)
