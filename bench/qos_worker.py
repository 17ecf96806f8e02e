"""The two jobs of ``bench qos``, each in a process of its own as a real job would be:

- ``loader``: emulated accelerators each reading a ``ShardStream`` of the dataset in a gold
  group, then computing (sleeping) each batch's time, epoch after epoch, until its standard
  input closes; it prints every step (rank, asked at, got at, bytes) on the machine's monotonic
  clock, which every process shares.
- ``checkpoint``: ranks of a ``Checkpointer`` in a bronze group saving one step of random
  bytes, started at a given moment of that clock; it prints when the save began and ended.

    python -m bench.qos_worker loader '{"cluster": ..., "path": ..., ...}'
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import numpy as np

from clients.checkpoint import Checkpointer
from clients.shardstream import ShardStream
from tectonic_emu import Cluster
from tectonic_emu.qos import TrafficGroup


async def loader(args: dict[str, Any]) -> dict[str, Any]:
    group = TrafficGroup.parse(args["group"])
    ranks, compute = int(args["ranks"]), float(args["compute_s"])
    steps: list[tuple[int, float, float, int]] = []
    stop = asyncio.Event()

    async def until_told() -> None:
        await asyncio.to_thread(sys.stdin.read)  # returns at end of input
        stop.set()

    told = asyncio.ensure_future(until_told())
    async with Cluster.open(args["cluster"]) as c:
        client = c.client()

        async def rank(r: int) -> None:
            epoch = 0
            while not stop.is_set():
                stream = ShardStream(
                    client,
                    args["path"],
                    rank=r,
                    world_size=ranks,
                    batch_size=int(args["batch"]),
                    seed=1,
                    epoch=epoch,
                    group=group,
                )
                async with stream:
                    while not stop.is_set():
                        asked = time.monotonic()
                        try:
                            batch = await anext(stream)
                        except StopAsyncIteration:
                            break
                        steps.append((r, asked, time.monotonic(), batch.nbytes))
                        await asyncio.sleep(compute)
                epoch += 1

        await asyncio.gather(*(rank(r) for r in range(ranks)))
    await told
    return {"steps": steps}


async def checkpoint(args: dict[str, Any]) -> dict[str, Any]:
    group = TrafficGroup.parse(args["group"])
    ranks, per_rank = int(args["ranks"]), int(args["bytes_per_rank"])
    rng = np.random.default_rng(int(args["step"]))
    states = {r: {"w": np.frombuffer(rng.bytes(per_rank), dtype=np.uint8)} for r in range(ranks)}
    async with Cluster.open(args["cluster"]) as c:
        ckpt = Checkpointer(c.client(), args["root"], world_size=ranks, keep_last=1, group=group)
        async with ckpt:
            await asyncio.sleep(max(0.0, float(args["start_at"]) - time.monotonic()))
            began = time.monotonic()
            await ckpt.save_many(int(args["step"]), states)
            ended = time.monotonic()
    return {"began": began, "ended": ended, "bytes": ranks * per_rank}


def main() -> None:
    job, args = sys.argv[1], json.loads(sys.argv[2])
    run = {"loader": loader, "checkpoint": checkpoint}[job]
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
