"""Claims on chunk writes in flight, so that garbage collection is fenced against commits.

Before anyone stores chunks of a block that is not committed yet (a writer's new block, or
repair's rebuilt chunks of a committed one), it records an ``IntentRecord`` in metadata and
keeps renewing it while it works (``ChunkIntent``). The commit removes the intent in the
transaction that adds (or swaps) the block record, and fails with ``FencedWriterError`` when
the intent is gone. Garbage collection lists chunks first and reads intents and blocks after,
so a chunk it sees was announced before it was written: it is taken only when neither a live
intent nor a block references it. An intent is live until it expires; a writer that was
paused (SIGSTOP) or died stops renewing, and garbage collection then removes its intent (and
takes its token) in one transaction, so its commit fails loudly instead of naming deleted
chunks. Liveness is a lease on the wall clock: hosts' clocks must agree to well within the
lease plus the collector's grace.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from tectonic_emu import clock, entropy
from tectonic_emu.errors import FencedWriterError
from tectonic_emu.metadata.layers import Metadata, MetaTxn
from tectonic_emu.metadata.records import REPAIR_OWNER, IntentRecord

# How long an intent holds without renewal. Renewed every third of it, so a live writer keeps
# its claim through two missed renewals (a busy event loop, a slow metadata transaction).
WRITE_LEASE = 30.0


def repair_owner() -> str:
    """A fresh owner name for one repair of one block."""
    return REPAIR_OWNER + entropy.token_hex(8)


class ChunkIntent:
    """``async with ChunkIntent(meta, block_id, file_id, owner) as intent``: the claim on a
    block's chunk writes, renewed in the background until the block exits.

    Entering records the intent. Inside, the caller writes chunks, then commits with
    ``settle`` in its own transaction. Leaving cancels the renewal and, unless settled, removes
    the intent (best effort: an expired intent is garbage collection's to remove). A writer's
    token is not checked here (one metadata read less per block): the commit checks it, and
    garbage collection counts a writer's claim live only while its token holds the file.
    """

    def __init__(
        self,
        meta: Metadata,
        block_id: int,
        file_id: int,
        owner: str,
        *,
        lease: float = WRITE_LEASE,
    ) -> None:
        self._meta = meta
        self.block_id = block_id
        self.file_id = file_id
        self.owner = owner
        self._lease = lease
        self._renewer: asyncio.Task[None] | None = None
        self.settled = False

    async def __aenter__(self) -> ChunkIntent:
        await self.start()
        return self

    async def start(self) -> None:
        """Record the intent and start renewing it (``async with`` does this; a claim that
        outlives one block of code calls ``start`` and ``end`` itself)."""
        async with self._meta.transaction(durable=False) as m:
            await m.intents.put(self._record())
        self._renewer = asyncio.create_task(self._renew())

    def _record(self) -> IntentRecord:
        return IntentRecord(self.block_id, self.owner, self.file_id, clock.wall() + self._lease)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 3)
            async with self._meta.transaction(durable=False) as m:
                if await m.intents.get(self.block_id, self.owner) is None:
                    return  # committed, or fenced: the commit says which
                await m.intents.put(self._record())

    async def settle(self, m: MetaTxn, path: str) -> None:
        """Inside the commit's transaction: remove the intent, or raise FencedWriterError
        (naming ``path``) when garbage collection took it, so that nothing is committed."""
        if await m.intents.get(self.block_id, self.owner) is None:
            raise FencedWriterError(
                f"garbage collection fenced the write of block {self.block_id:016x}: its "
                "lease expired (was the writer paused or cut off?); bytes committed before "
                "it stay",
                path,
            )
        await m.intents.delete(self.block_id, self.owner)
        self.settled = True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.end()

    async def end(self) -> None:
        """Stop renewing; remove the intent unless settled (best effort)."""
        if self._renewer is not None:
            self._renewer.cancel()
            # wait, not await: a cancellation of our own task must not be swallowed here
            await asyncio.wait([self._renewer])
            if not self._renewer.cancelled():
                self._renewer.exception()  # a failed renewal: the commit will say so
        if not self.settled:
            with contextlib.suppress(OSError):
                await asyncio.shield(self._drop())

    async def _drop(self) -> None:
        async with self._meta.transaction(durable=False) as m:
            await m.intents.delete(self.block_id, self.owner)


__all__ = ["WRITE_LEASE", "ChunkIntent", "repair_owner"]
