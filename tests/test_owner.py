"""One owner per cluster (issue 19): a lock with liveness decides embedded or served.

Real processes throughout: embedded processes beside each other and beside an exclusive one
(a metadata restore), a second ``serve``, a SIGKILLed ``serve`` (whose nodes die with it) and
a SIGSTOPped node that outlives its supervisor.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tectonic_emu import Cluster
from tectonic_emu.errors import ClusterBusyError
from tectonic_emu.nodectl import pid_exited, read_address
from tectonic_emu.served import Serving

from .conftest import make_cluster, run_with
from .test_cli import fails, ok

HOLD = """
import asyncio, sys
from tectonic_emu import Cluster

async def main():
    async with Cluster.open(sys.argv[1], exclusive=sys.argv[2] == "exclusive") as c:
        print("owned" if c.owned else "client", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

asyncio.run(main())
"""


class Holder:
    """A process that opens the cluster and keeps it open until told (or killed)."""

    def __init__(self, root: Path, mode: str = "embedded") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(root), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        self.said = self.proc.stdout.readline().decode().strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_cluster(tmp_path / "c", nodes=4, encoding="r3", disks_per_node=1)


@pytest.fixture
def holder(root: Path) -> Iterator[Holder]:
    h = Holder(root)
    try:
        yield h
    finally:
        if h.proc.poll() is None:
            h.proc.kill()
        h.proc.wait(30)


def test_embedded_processes_share_but_not_with_an_exclusive_one(
    root: Path, holder: Holder, tmp_path: Path
) -> None:
    assert holder.said == "owned"
    ok("mkdir", "/beside", cluster=root)  # ranks of one job, a mount and the CLI: shared
    ok("meta", "dump", str(tmp_path / "m.dump"), cluster=root)
    line = fails(
        "meta", "load", "--force", str(tmp_path / "m.dump"), cluster=root,
        mentions=f"pid {holder.proc.pid}",
    )  # fmt: skip
    assert "embedded" in line and socket.gethostname() in line and "since" in line

    async def go() -> None:
        async with Cluster.open(root, exclusive=True):
            pass

    with pytest.raises(ClusterBusyError, match=f"pid {holder.proc.pid}"):
        asyncio.run(go())
    holder.close()
    ok("meta", "load", "--force", str(tmp_path / "m.dump"), cluster=root)  # alone now


def test_nothing_else_opens_a_cluster_held_exclusively(root: Path) -> None:
    restoring = Holder(root, "exclusive")
    try:
        assert restoring.said == "owned"
        line = fails("ls", "/", cluster=root, mentions=f"pid {restoring.proc.pid}")
        assert "exclusive" in line
        fails("serve", cluster=root, mentions=f"pid {restoring.proc.pid}")
    finally:
        restoring.close()
    ok("ls", "/", cluster=root)


def test_a_killed_owner_holds_nothing(root: Path, holder: Holder) -> None:
    holder.proc.kill()
    holder.proc.wait(30)
    # No stale lock to clear: the kernel dropped it, and its record names a dead process.

    async def go() -> bool:
        async with Cluster.open(root, exclusive=True) as c:
            return c.owned

    assert asyncio.run(go())


def test_serve_is_refused_while_an_embedded_process_owns_the_cluster(
    root: Path, holder: Holder
) -> None:
    fails("serve", cluster=root, mentions=f"pid {holder.proc.pid}")
    assert read_address(root, 0) is None  # no node was started


def test_a_node_is_not_served_beside_an_embedded_owner(root: Path, holder: Holder) -> None:
    fails("node", "serve", "--node", "1", cluster=root, mentions=f"pid {holder.proc.pid}")
    assert read_address(root, 1) is None


def test_one_process_may_open_its_cluster_many_times(root: Path) -> None:
    async def go() -> list[bool]:
        async with Cluster.open(root) as a, Cluster.open(root) as b:
            await a.client().mkdir("/one")
            assert await b.client().exists("/one")
            return [a.owned, b.owned]

    assert asyncio.run(go()) == [True, True]
    after = Holder(root)
    after.close()
    assert after.said == "owned"  # it let go when the last one closed


def test_served_clients_are_not_owners_and_a_second_serve_is_refused(root: Path) -> None:
    with Serving(root, repair_interval=0) as serving:
        assert serving.proc is not None
        a, b = Holder(root), Holder(root)  # any number of clients
        try:
            assert a.said == b.said == "client"
            ok("mkdir", "/shared", cluster=root)
            line = fails("serve", cluster=root, mentions=f"pid {serving.proc.pid}")
            assert "served" in line
        finally:
            a.close()
            b.close()


def _node_pids(root: Path, nodes: int) -> list[int]:
    pids = []
    for n in range(nodes):
        addr = read_address(root, n)
        assert addr is not None
        pids.append(addr.pid)
    return pids


def _wait_exited(pids: list[int]) -> None:
    deadline = time.monotonic() + 30  # a safety net: PR_SET_PDEATHSIG acts at once
    while not all(pid_exited(p) for p in pids):
        assert time.monotonic() < deadline, "node processes outlived their supervisor"
        time.sleep(0.02)


def test_after_serve_is_sigkilled_the_cluster_is_embedded_once_its_nodes_are_gone(
    root: Path,
) -> None:
    serving = Serving(root, repair_interval=0).start()
    assert serving.proc is not None
    try:
        ok("mkdir", "/before", cluster=root)
        pids = _node_pids(root, 4)
        stopped = pids[2]
        os.kill(stopped, signal.SIGSTOP)  # this one cannot act on its SIGTERM yet
        serving.proc.kill()
        serving.proc.wait(30)
        _wait_exited([p for p in pids if p != stopped])
        # A node of the dead supervisor still runs: it owns its directory, so an open is
        # its client, never an embedded owner writing beside it.
        h = Holder(root)
        h.close()
        assert h.said == "client"
        os.kill(stopped, signal.SIGCONT)  # it takes its SIGTERM and exits
        _wait_exited([stopped])

        async def go(c: Cluster) -> tuple[bool, bool, list[str]]:
            return c.owned, c.served, await c.client().listdir("/")

        assert run_with(root, go) == (True, False, ["before"])
        with Serving(root, repair_interval=0):  # and serve may own it again
            ok("mkdir", "/again", cluster=root)
    finally:
        serving.stop()
        for p in _node_pids_or_none(root, 4):
            if not pid_exited(p):
                os.kill(p, signal.SIGCONT)


def _node_pids_or_none(root: Path, nodes: int) -> list[int]:
    return [a.pid for n in range(nodes) if (a := read_address(root, n)) is not None]
