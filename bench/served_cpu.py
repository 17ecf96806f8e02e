"""CPU seconds of served I/O: the client and every node process, for one write and one read.

Ad hoc, for docs/performance.md (*Authentication*): it serves a fresh 9-node cluster, writes
``SIZE`` random bytes through ``Cluster.open`` (``write_ack="all"``, drained), reads them
back, and reads utime + stime of this process (``getrusage``) and of the node processes
(``/proc/<pid>/stat``) around each phase. Prints one JSON line. ``payload-tags`` makes every
data connection ask for payload tags, as a link between hosts has them (``auth.py``)::

    python -m bench.served_cpu 536870912 rs-6-3 [payload-tags]

With ``bench/authtime`` first on PYTHONPATH and AUTHTIME_DIR set (its ``sitecustomize.py``),
each phase also gets ``auth_cpu``: the CPU seconds all processes spent in frame tags and
handshakes during it.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from tectonic_emu import Cluster
from tectonic_emu.chunkstore.remote import RemoteNode
from tectonic_emu.nodectl import read_address
from tectonic_emu.served import Serving

NODES = 9
_TICK = os.sysconf("SC_CLK_TCK")


def _node_cpu(root: Path) -> float:
    total = 0.0
    for n in range(NODES):
        addr = read_address(root, n)
        assert addr is not None, f"node {n} is not served"
        with open(f"/proc/{addr.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return total


def _auth_cpu() -> float:
    """CPU seconds in authentication so far, summed over the processes (bench/authtime)."""
    where = os.environ.get("AUTHTIME_DIR")
    if not where:
        return 0.0
    return sum(float((Path(where) / f).read_text().split()[1]) for f in os.listdir(where))


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(size: int, encoding: str, payload_tags: bool) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "c"
        Cluster.create(root, nodes=NODES, encoding=encoding, block_size=8 << 20)
        data = os.urandom(size)
        out: dict[str, dict[str, float]] = {}
        with Serving(root, repair_interval=0):
            async with Cluster.open(root, write_ack="all") as c:
                if payload_tags:  # data connections open lazily, so after this
                    for node in c.nodes:
                        assert isinstance(node, RemoteNode)
                        node.payload_tags = True
                client = c.client()
                await client.write_file("/warm", data[: 64 << 20])
                await client.read_file("/warm")
                for phase in ("write", "read"):
                    auth0 = _auth_cpu()
                    own, nodes, t0 = _own_cpu(), _node_cpu(root), time.perf_counter()
                    if phase == "write":
                        await client.write_file("/f", data)
                        await c.datapath.drain()
                    elif await client.read_file("/f") != data:
                        raise AssertionError("read back other bytes")
                    out[phase] = {
                        "client_cpu": round(_own_cpu() - own, 3),
                        "node_cpu": round(_node_cpu(root) - nodes, 3),
                        "wall": round(time.perf_counter() - t0, 3),
                    }
                    if os.environ.get("AUTHTIME_DIR"):
                        await asyncio.sleep(0.5)  # the nodes' last counts reach their files
                        out[phase]["auth_cpu"] = round(_auth_cpu() - auth0, 4)
        return out


def main(argv: list[str]) -> None:
    size = int(argv[0]) if argv else 512 << 20
    encoding = argv[1] if len(argv) > 1 else "rs-6-3"
    payload_tags = len(argv) > 2 and argv[2] == "payload-tags"
    print(json.dumps(asyncio.run(measure(size, encoding, payload_tags))))


if __name__ == "__main__":
    main(sys.argv[1:])
