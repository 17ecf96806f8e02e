"""Output people read: the demo, served cluster status, serve in the background, and the
transfer bars, each as a user sees it (a real process; a terminal of 80 columns)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tectonic_emu import Cluster
from tectonic_emu.coding import KNOWN_ENCODINGS
from tectonic_emu.demo import _victim

from .test_cli import ENV_VAR, tecto


def narrow(*args: str, cluster: Path | None = None) -> str:
    """``tectonic-emu ARGS`` at 80 columns; its stdout, after checking every line fits whole."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR} | {"COLUMNS": "80"}
    if cluster is not None:
        env[ENV_VAR] = str(cluster)
    r = subprocess.run(
        [sys.executable, "-m", "tectonic_emu", *args], capture_output=True, env=env, timeout=300
    )
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    for line in out.splitlines():
        assert len(line) <= 80, line
        assert "…" not in line, line  # a cell cut short
    return out


def test_the_demo_says_which_encodings_the_node_it_lost_held(tmp_path: Path) -> None:
    report = json.loads(narrow("demo", "--size", "16MiB", "--json"))
    assert report["all_verified"] and report["below_redundancy_after_restart"] == 0
    held = report["stopped_node_encodings"]
    assert "r1" not in held and held, held  # r1 keeps one copy: losing it would lose data
    table = narrow("demo", "--size", "1MiB")
    assert " lost" in table and "{" not in table  # no Python dict or repr printed
    said = [ln for ln in table.splitlines() if ln.startswith("node ")]
    assert len(said) == 1
    assert said[0].endswith("held chunks of every encoding but r1 (one copy survives no loss)") or (
        "held no chunks of" in said[0]
    ), said


SIZES = st.lists(st.integers(1, 24 << 20), min_size=6, max_size=6)  # one per encoding


@given(SIZES)
@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_demo_loses_the_node_that_holds_the_most_encodings(
    tmp_path: Path, sizes: list[int]
) -> None:
    """Against a model: of the nodes that hold no r1 chunk, one holding chunks of as many
    encodings as any does."""
    root = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
    Cluster.create(root, nodes=15, encoding="rs-6-3", block_size=1 << 20)

    async def go() -> None:
        async with Cluster.open(root) as cluster:
            client = cluster.client()
            await client.mkdir("/demo")
            for name, size in zip(KNOWN_ENCODINGS, sizes, strict=True):
                await client.write_file(f"/demo/{name}.bin", os.urandom(size), encoding=name)
            holds: dict[int, set[str]] = {n: set() for n in range(15)}
            for name in KNOWN_ENCODINGS:
                for b in await client.layout(f"/demo/{name}.bin"):
                    for ch in b.chunks:
                        holds[ch.node].add(name)
            victim, held = await _victim(cluster, client)
            assert "r1" not in holds[victim]
            best = max(len(h) for h in holds.values() if "r1" not in h)
            assert len(holds[victim]) == best
            assert held == [e for e in KNOWN_ENCODINGS if e in holds[victim]]

    asyncio.run(go())


def test_serve_in_the_background_then_status_in_80_columns_then_stop(tmp_path: Path) -> None:
    root = tmp_path / "c"
    assert tecto("cluster", "create", "--nodes", "9", cluster=root).returncode == 0
    r = tecto("serve", "--background", "--repair-after", "60s", cluster=root)
    try:
        assert r.returncode == 0, r.stderr.decode()
        line = r.stdout.decode()
        assert "serving" in line and "tectonic-emu serve --stop" in line
        # Returns once every node is live: status sees all nine up at once.
        status = json.loads(tecto("cluster", "status", "--json", cluster=root).stdout)
        assert status["served"] and all(n["state"] == "up" for n in status["nodes"])
        table = narrow("cluster", "status", cluster=root)
        for n in status["nodes"]:
            assert n["address"] in table  # whole, not cut to fit
        again = tecto("serve", "--background", cluster=root)
        err = again.stderr.decode().splitlines()
        assert again.returncode == 1 and len(err) == 1 and "already served" in err[0], err
    finally:
        stop = tecto("serve", "--stop", cluster=root)
    assert stop.returncode == 0 and b"stopped serve (pid" in stop.stdout, stop
    assert not (root / "serve.json").exists()
    assert not any((root / "nodes").glob("*/address.json"))  # every node stopped too
    assert b"nothing serves" in tecto("serve", "--stop", cluster=root).stdout


def on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Run a command with stderr on a pseudo-terminal (as a user's shell has it); what it
    drew there."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=slave, env=env)
    os.close(slave)
    drawn = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the other end closed
                break
            if not data:
                break
            drawn += data
        elif proc.poll() is not None:
            break
    proc.wait(10)
    os.close(master)
    assert proc.returncode == 0, drawn.decode(errors="replace")
    return drawn.decode(errors="replace")


def test_a_transfer_bar_shows_a_percentage_and_an_eta(tmp_path: Path) -> None:
    root = tmp_path / "c"
    assert tecto("cluster", "create", "--nodes", "9", cluster=root).returncode == 0
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(96 << 20))
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR} | {
        ENV_VAR: str(root),
        "COLUMNS": "100",
        "TERM": "xterm",
    }
    drawn = on_a_terminal([sys.executable, "-m", "tectonic_emu", "put", str(src), "/big"], env)
    assert "put /big" in drawn
    assert "100%" in drawn, drawn  # the percentage, at least as it finished
    assert "96.0 MiB" in drawn or "96 MiB" in drawn  # bytes of the total
    assert "-:--:--" in drawn or "0:00:0" in drawn, drawn  # the ETA column
