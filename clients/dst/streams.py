"""The ``stream`` workload of deterministic simulation testing: a training dataset (a
described one, as a projection's: ``generate_described``) is stored before the faults,
then every rank reads its epoch through the real ``ShardStream`` while they fall,
computing a while on each batch.

What must hold: each rank gets exactly the samples ``rank_order`` gives it, in that
order (every sample of the epoch to exactly one rank, none twice, none lost), and every
piece the stream reads passes its check against the dataset's index (the stream raises
``DatasetCorruptError`` otherwise: a violation). A rank whose epoch is refused while the
metadata store is down reads it again from the start, as a restarted loader would.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np

from clients.dataset import DatasetIndex, ShardStream, generate_described, rank_order
from clients.dst.files import refused, until_up
from tectonic_emu.client import Client

DATASET = "/data"
SAMPLES, RECORD, PER_SHARD = 240, 3_000, 30  # 8 shards of 90 KB
RANKS_PER_HOST, BATCH = 2, 6
COMPUTE_S = 0.03  # at most this long a rank computes on each batch: reads span the faults


async def store_dataset(client: Client, seed: int) -> DatasetIndex:
    """The dataset, written before the faults (again, while refused)."""
    return await until_up(
        lambda: generate_described(
            client,
            "resnet50",
            DATASET,
            samples=SAMPLES,
            record_bytes=RECORD,
            seed=seed,
            rows_per_shard=PER_SHARD,
            overwrite=True,
        )
    )


async def read_epochs(
    clients: Sequence[Client],
    index: DatasetIndex,
    rng: random.Random,
    outcomes: Counter[str],
    violations: list[str],
) -> None:
    """Every rank's epoch, ranks of a host one after another, hosts at once."""
    world = RANKS_PER_HOST * len(clients)
    seed, epoch = rng.randrange(1 << 16), rng.randrange(1, 4)
    compute = [rng.uniform(0.0, COMPUTE_S) for _ in range(world)]  # per batch, per rank

    async def rank(client: Client, r: int) -> None:
        want = rank_order(index, rank=r, world_size=world, seed=seed, epoch=epoch)
        while True:
            got: list[np.ndarray] = []
            try:
                async with ShardStream(
                    client, DATASET, rank=r, world_size=world, batch_size=BATCH, seed=seed,
                    epoch=epoch,
                ) as s:  # fmt: skip
                    async for b in s:
                        got.append(b.column("index").to_numpy())
                        await asyncio.sleep(compute[r])  # the step's compute
            except Exception as exc:  # a refusal is read again; anything else reported
                if not refused(exc):
                    violations.append(f"rank {r}'s epoch raised {type(exc).__name__}: {exc}")
                    return
                outcomes[f"epoch {type(exc).__name__}"] += 1
                await asyncio.sleep(0.01)
                continue
            break
        read = np.concatenate(got) if got else np.zeros(0, dtype=np.int64)
        if not np.array_equal(read, want):
            violations.append(
                f"rank {r} read {len(read)} samples of epoch {epoch}, not the {len(want)} "
                "rank_order gives it, in its order"
            )
        outcomes["epoch ok"] += 1

    async def host(h: int) -> None:
        for k in range(RANKS_PER_HOST):
            await rank(clients[h], h * RANKS_PER_HOST + k)

    await asyncio.gather(*(host(h) for h in range(len(clients))))


__all__ = ["DATASET", "read_epochs", "store_dataset"]
