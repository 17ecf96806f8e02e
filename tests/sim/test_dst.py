"""Deterministic simulation testing (``clients/dst``, issue 24): seeded fault schedules
over a whole model cluster, the real client, data path and repair in virtual time."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from clients.dst import faults, run_seed, run_seeds
from tectonic_emu.cli import cli as cli_main

SEEDS = 100  # per CI run, for now (about 0.1 s each here)


def test_a_seed_replays_exactly() -> None:
    """The same seed gives the same faults, operations, outcomes and trace, event for
    event; another seed another trace."""
    a, b = run_seed(11), run_seed(11)
    assert a == b and a.trace == b.trace
    assert run_seed(12).trace != a.trace


def test_every_seed_holds_every_invariant() -> None:
    summary = run_seeds(0, SEEDS)
    assert summary.seeds == SEEDS
    assert [r.violations for r in summary.failed] == []
    assert set(summary.faults) == set(faults.KINDS)  # every kind fell somewhere
    for op in ("put ok", "stream ok", "delete ok", "read ok"):
        assert summary.ops[op] > 0


def test_the_schedule_damages_no_more_servers_than_the_encoding_tolerates() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        victims = rng.randint(0, 2)
        fs = faults.schedule(rng, servers=8, victims=victims, horizon=0.4, count=8)
        assert len({f.server for f in fs if f.kind in faults.DAMAGE}) <= victims
        assert [f.at for f in fs] == sorted(f.at for f in fs)
        assert all(0 <= f.at <= 0.4 and 0 <= f.server < 8 for f in fs)


def _beyond_tolerance(monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage on every server: more bad chunks per block than any encoding survives."""

    def everywhere(rng: random.Random, **_: object) -> list[faults.Fault]:
        at = sorted(rng.uniform(0.1, 0.4) for _ in range(100))
        return [faults.Fault(t, "lose", rng.randrange(8), pick=rng.randrange(1 << 30)) for t in at]

    monkeypatch.setattr("clients.dst.run.schedule", everywhere)


def test_lost_data_is_caught_and_its_seed_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariants can fail: with chunks lost on every server, some seed loses
    acknowledged bytes, the run says so, and its replay command fails the same way."""
    _beyond_tolerance(monkeypatch)
    failed = run_seeds(0, 10).failed
    assert failed, "losing chunks on every server lost nothing"
    r = failed[0]
    assert any("unrecoverable" in v or "unreadable" in v for v in r.violations)
    assert run_seed(r.seed) == r
    out = CliRunner().invoke(cli_main, [*r.replay.split()[1:], "--json"])
    assert out.exit_code == 1
    d = json.loads(out.output)
    assert d["seeds"] == 1 and d["failed"][0]["violations"] == list(r.violations)
    assert d["failed"][0]["replay"] == r.replay


def test_the_command_reports_seeds_faults_and_operations() -> None:
    out = CliRunner().invoke(cli_main, ["simulate", "faults", "--seeds", "3", "--seed", "5"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("3 seeds from 5: 0 failed, 0 violations")
    assert "faults injected" in out.output and "put ok" in out.output
    assert max(len(line) for line in out.output.splitlines()) <= 80
    out = CliRunner().invoke(cli_main, ["simulate", "faults", "--seeds", "2", "--json"])
    d = json.loads(out.output)
    assert d["seeds"] == 2 and d["violations"] == 0 and d["failed"] == []
    bad = CliRunner().invoke(cli_main, ["simulate", "faults", "--workload", "nope"])
    assert bad.exit_code == 2 and "nope" in bad.output
