"""The emulated network (``tectonic_emu/chunkstore/netem.py``): the pacing arithmetic against
a simple model, the settings' validation, and ``bench net`` on a real paced link."""

from __future__ import annotations

import asyncio
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import tectonic_emu.chunkstore.netem as netem
from bench import net
from bench.schema import schema_of
from tectonic_emu import Cluster, clock
from tectonic_emu.chunkstore.netem import Bucket, Line, LinkModel, Pacer
from tectonic_emu.errors import InvalidArgumentError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@given(
    rate=st.floats(1e3, 1e10),
    steps=st.lists(st.tuples(st.floats(0, 0.01), st.integers(0, 1 << 24)), max_size=30),
)
def test_a_line_sends_in_order_at_its_rate(rate: float, steps: list[tuple[float, int]]) -> None:
    """Model: the line is busy until ``free``; a reservation made at ``t`` of ``n`` bytes
    ends at max(t, free) + n / rate, and the wait returned is that end less ``t``."""
    clock = Clock()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(netem.clock, "monotonic", clock)  # the clock seam, faked
        line = Line(rate)
        free = 0.0
        for gap, n in steps:
            clock.now += gap
            free = max(clock.now, free) + n / rate
            assert math.isclose(line.reserve(n), free - clock.now, rel_tol=1e-9, abs_tol=1e-9)


def test_pacing_runs_in_virtual_time() -> None:
    """On a virtual loop (clock.py) a 1 Gb/s NIC with a 4 ms round trip holds three 125 MB
    frames sent at once for exactly 1, 2 and 3 s plus half the round trip, in no wall time."""

    async def main() -> list[float]:
        pacer = Pacer(LinkModel(gbps=1.0, rtt_ms=4.0), burst=1 << 20)
        start = clock.monotonic()

        async def send() -> float:
            await pacer.before_send(125_000_000)
            return clock.monotonic() - start

        return list(await asyncio.gather(send(), send(), send()))

    assert clock.run_virtual(main()) == pytest.approx([1.002, 2.002, 3.002], abs=1e-9)


@example(rate=55746804.0, burst=1, steps=[(0.0, 2)])  # the fake clock's rounding, not the bucket
@given(
    rate=st.floats(1e3, 1e9),
    burst=st.integers(1, 1 << 24),
    steps=st.lists(st.tuples(st.floats(0, 0.05), st.integers(0, 1 << 22)), max_size=30),
)
def test_a_bucket_never_lets_more_than_rate_and_burst_through(
    rate: float, burst: int, steps: list[tuple[float, int]]
) -> None:
    """Whatever comes in, a receiver that waits as told takes in at most
    ``burst + rate * elapsed`` bytes by any time."""
    clock = Clock()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(netem.clock, "monotonic", clock)  # the clock seam, faked
        bucket = Bucket(rate, burst)
        start, taken = clock.now, 0
        for gap, n in steps:
            clock.now += gap
            taken += n
            wait = bucket.take(n)
            assert wait >= 0
            clock.now += wait  # the connection stops reading this long
            # The fake clock's own rounding: at 1,000 s its steps are 1.1e-13 s apart, which
            # at 56 MB/s is 6e-6 of a byte (hypothesis found burst 1, a take of 2 at once).
            rounding = rate * 4 * math.ulp(clock.now)
            assert taken <= burst + rate * (clock.now - start) + 1e-6 * max(1.0, taken) + rounding


def test_loss_costs_a_round_trip_per_lost_segment_and_a_timeout_at_the_tail() -> None:
    pacer = Pacer(LinkModel(0, 10, 0.5), burst=0, rng=random.Random(7))
    assert pacer.egress is None and pacer.ingress is None
    costs = [pacer.send_delay(100) - 0.005 for _ in range(2000)]  # one segment: all tail
    assert set(costs) == {0.0, 0.2}  # lost or not: the minimum RTO, as the RTT is 10 ms
    assert 0.4 < costs.count(0.2) / len(costs) < 0.6
    big = [pacer.send_delay(1448 * 103) - 0.005 for _ in range(200)]  # 100 body segments
    mean_body = sum(c - (0.2 if c >= 0.2 else 0) for c in big) / len(big)
    assert 0.3 < mean_body < 0.7  # about 50 losses x 10 ms


def test_no_model_no_pacing() -> None:
    pacer = Pacer(LinkModel(), burst=1 << 20)
    assert not LinkModel().active and pacer.send_delay(1 << 30) == 0 and pacer.received(1) == 0


@pytest.mark.parametrize(
    "flag, value", [("--nic-gbps", "-1"), ("--rtt-ms", "nan"), ("--loss", "1"), ("--loss", "-0.1")]
)
def test_bad_network_settings_are_refused(tmp_path: Path, flag: str, value: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tectonic_emu", "cluster", "create", "--cluster",
         str(tmp_path / "c"), flag, value],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert not (tmp_path / "c" / "cluster.json").exists()
    with pytest.raises(InvalidArgumentError):
        Cluster.create(tmp_path / "d", **{flag[2:].replace("-", "_"): float(value)})


def test_bench_net_paces_a_real_link(tmp_path: Path) -> None:
    """A node process and this client, each pacing its NIC at 0.2 Gb/s with 20 ms of round
    trip: the link never runs faster than set, nor answers sooner. (Whether it comes within
    10% is the bench's own verdict: a loaded machine may make it slower.)"""
    res = asyncio.run(
        net.run_net_bench(
            directory=tmp_path, nic_gbps=0.2, rtt_ms=20, chunk=256 << 10, seconds=0.6, runs=1,
            pings=5,
        )
    )  # fmt: skip
    doc = res.to_dict()
    import jsonschema

    jsonschema.validate(doc, net.SCHEMA)
    assert schema_of(net.NetBench, net.SCHEMA["$id"], net.SCHEMA["title"]) == net.SCHEMA
    assert 0 < doc["write_gbps"] <= 0.2 * 1.1 and 0 < doc["read_gbps"] <= 0.2 * 1.1
    assert doc["rtt_ms_measured"] >= 20 - 1  # held to the nearest millisecond
    assert set(doc["within_10pct"]) == {"rtt", "write", "read"}
    assert list(tmp_path.iterdir()) == []
    json.dumps(doc)
