"""The ``files`` workload of deterministic simulation testing: writers on client hosts
put whole files, stream files through the single writer with a flush per piece, crash or
stall a writer and take its file over, delete files and read them back, while faults fall
(``faults.py``).

``Ledger`` is the model: what each path must hold, as acknowledged. A put that returned
holds its bytes; a streamed file holds at least what its last returned flush covered (and
exactly its bytes once closed); a delete that returned leaves nothing. Each host owns its
own directory, so no two writers race for a path and the model needs no locks. Every read
is checked against the model as it happens; ``check`` checks every path at the end.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tectonic_emu import clock
from tectonic_emu.client import Client
from tectonic_emu.errors import (
    FencedWriterError,
    NodeUnavailableError,
    NoSpaceError,
    NotEnoughNodesError,
    NotFoundError,
    QuotaExceededError,
    TectonicError,
)

# What a write may meet while faults fall, and answer honestly: the bytes were not
# acknowledged, and the model does not count them. So may any operation while the
# metadata store is down: the OSError a backend raises when its connection resets,
# refused, times out (``PostgresKV``'s; ``ModelKV.down``), nothing of it committed.
T = TypeVar("T")
REFUSALS = (NotEnoughNodesError, NodeUnavailableError, NoSpaceError, QuotaExceededError)
BACKEND_DOWN = frozenset({errno.ECONNRESET, errno.ECONNREFUSED, errno.ETIMEDOUT})


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is an honest refusal (above), not a bug."""
    if isinstance(exc, REFUSALS):
        return True
    return (
        isinstance(exc, OSError)
        and not isinstance(exc, TectonicError)
        and exc.errno in BACKEND_DOWN
    )


async def until_up(make: Callable[[], Awaitable[T]]) -> T:
    """``make()``, tried again every 10 ms while it is refused (set-up and checks that
    must happen, whatever the faults)."""
    while True:
        try:
            return await make()
        except OSError as exc:
            if not refused(exc):
                raise
        await asyncio.sleep(0.01)


MAX_FILE = 250_000  # bytes: up to two rs-3-2 blocks of the 64 KiB chunks the runs use
PIECES = 4  # pieces of a streamed file, each flushed


@dataclass(slots=True)
class Ledger:
    """The acknowledged state: each path's bytes, and whether its file is sealed (exactly
    them) or still open (at least them: bytes appended beyond the last flush may be
    committed too)."""

    files: dict[str, bytes] = field(default_factory=dict)
    sealed: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)

    def expect(self, path: str, got: bytes) -> str | None:
        """Why ``got`` cannot be what ``path`` holds (None: it can)."""
        want = self.files[path]
        if path in self.sealed and got != want:
            return f"{path}: read {len(got)} bytes that differ from the {len(want)} acknowledged"
        if path not in self.sealed and got[: len(want)] != want:
            return f"{path}: the {len(want)} flushed bytes do not read back"
        return None


@dataclass(slots=True)
class Host:
    """One writer: its client, its directory, its random stream, and what it saw."""

    index: int
    client: Client
    rng: random.Random
    ledger: Ledger
    trace: list[tuple[object, ...]]
    violations: list[str]
    outcomes: Counter[str] = field(default_factory=Counter)
    made: int = 0

    @property
    def root(self) -> str:
        return f"/h{self.index}"

    def log(self, op: str, path: str, outcome: str) -> None:
        self.trace.append((round(clock.monotonic(), 9), self.index, op, path, outcome))
        self.outcomes[f"{op} {outcome}"] += 1

    def mine(self) -> list[str]:
        return sorted(p for p in self.ledger.files if p.startswith(self.root + "/"))


async def put(h: Host) -> None:
    h.made += 1
    path = f"{h.root}/f{h.made}"
    data = h.rng.randbytes(h.rng.randrange(MAX_FILE))
    try:
        await h.client.write_file(path, data)
    except OSError as exc:
        if not refused(exc):
            raise
        h.log("put", path, type(exc).__name__)
        return
    h.ledger.files[path] = data
    h.ledger.sealed.add(path)
    h.log("put", path, "ok")


async def stream(h: Host) -> None:
    h.made += 1
    path = f"{h.root}/s{h.made}"
    flushed = b""
    try:
        writer = await h.client.open_writer(path)
        try:
            for _ in range(PIECES):
                piece = h.rng.randbytes(h.rng.randrange(MAX_FILE // PIECES))
                await writer.append(piece)
                await writer.flush()
                flushed += piece
                h.ledger.files[path] = flushed
            await writer.close()
        except BaseException:
            await asyncio.shield(writer.abort())
            raise
    except OSError as exc:
        if not refused(exc):
            raise
        h.log("stream", path, type(exc).__name__)
        return
    h.ledger.sealed.add(path)
    h.log("stream", path, "ok")


async def takeover(h: Host) -> None:
    """A writer flushes a piece and appends another; then it crashes (``abort``: its
    unflushed bytes dropped) or stalls, and a second writer takes the file over. A stalled
    writer must then be fenced (its flush raises FencedWriterError); the file must hold
    the flushed piece and at most the rest of what the first writer appended; the second
    writer's piece follows and it seals the file."""
    h.made += 1
    path = f"{h.root}/t{h.made}"
    first, rest, last = (h.rng.randbytes(h.rng.randrange(MAX_FILE // 3)) for _ in range(3))
    crash = h.rng.random() < 0.5
    try:
        old = await h.client.open_writer(path)
        await old.append(first)
        await old.flush()
        h.ledger.files[path] = first
        await old.append(rest)
        if crash:
            await old.abort()
        new = await h.client.open_writer(path)
    except OSError as exc:
        if not refused(exc):
            raise
        h.log("takeover", path, type(exc).__name__)
        return
    try:
        if not crash:
            try:
                await old.append(b"x")
                await old.flush()
            except FencedWriterError:
                pass
            else:
                h.violations.append(f"{path}: a writer taken over still flushed")
        held = bytes(await h.client.read_file(path))
        if not (held.startswith(first) and (first + rest).startswith(held)):
            h.violations.append(
                f"{path}: {len(held)} bytes after the takeover, not the {len(first)} flushed "
                f"and at most {len(rest)} more the first writer appended"
            )
        h.ledger.files[path] = held
        await new.append(last)
        await new.close()
    except OSError as exc:
        if not refused(exc):
            raise
        await asyncio.shield(new.abort())
        h.log("takeover", path, type(exc).__name__)
        return
    h.ledger.files[path] = held + last
    h.ledger.sealed.add(path)
    h.log("takeover", path, "crashed" if crash else "fenced")


async def delete(h: Host) -> None:
    paths = h.mine()
    if not paths:
        return
    path = h.rng.choice(paths)
    try:
        await h.client.delete(path)
    except OSError as exc:
        if not refused(exc):
            raise
        h.log("delete", path, type(exc).__name__)
        return
    del h.ledger.files[path]
    h.ledger.sealed.discard(path)
    h.ledger.deleted.add(path)
    h.log("delete", path, "ok")


async def read(h: Host) -> None:
    paths = h.mine()
    if not paths:
        return
    path = h.rng.choice(paths)
    try:
        got = await h.client.read_file(path)
    except OSError as exc:
        if not refused(exc) or isinstance(exc, REFUSALS):  # the data must stay readable
            raise
        h.log("read", path, type(exc).__name__)
        return
    why = h.ledger.expect(path, bytes(got))
    if why is not None:
        h.violations.append(f"during the faults, {why}")
    h.log("read", path, "ok" if why is None else "wrong")


OPS: tuple[tuple[Callable[[Host], object], int], ...] = (
    (put, 4),
    (stream, 2),
    (takeover, 1),
    (delete, 1),
    (read, 4),
)


async def run_host(h: Host, ops: int, pause: float) -> None:
    """``ops`` operations drawn by weight, ``pause`` seconds apart at most. An error a
    write may meet is counted; any other error is a violation (none is swallowed)."""
    await until_up(lambda: h.client.mkdir(h.root, exist_ok=True))
    funcs, weights = zip(*OPS, strict=True)
    for _ in range(ops):
        op = h.rng.choices(funcs, weights)[0]
        try:
            await op(h)  # type: ignore[misc]
        except Exception as exc:  # every other error is a violation, reported
            h.violations.append(f"{op.__name__} raised {type(exc).__name__}: {exc}")
            h.log(op.__name__, "?", type(exc).__name__)
        await asyncio.sleep(h.rng.uniform(0.0, pause))


async def make_tenants(hosts: Sequence[Host], rng: random.Random) -> None:
    """Each host's directory the namespace of a tenant of its own, with a quota of bytes
    that some runs reach (its writes then refused with EDQUOT, nothing stored lost)."""
    for h in hosts:
        quota = rng.choice((None, 500_000, 1_500_000))
        await h.client.tenants.create(f"t{h.index}", [h.root], quota_bytes=quota)


async def check_tenants(client: Client, hosts: Sequence[Host]) -> list[str]:
    """Each tenant's usage, as the metadata transactions charged it, against a recount."""
    out = []
    for h in hosts:
        t = await client.tenants.get(f"t{h.index}")
        counted = await client.tenants.recount(t.name)
        if (t.files_used, t.bytes_used) != counted:
            out.append(
                f"tenant {t.name} uses {t.files_used} files and {t.bytes_used} bytes, "
                f"a recount finds {counted[0]} and {counted[1]}"
            )
    return out


async def check(client: Client, ledger: Ledger) -> list[str]:
    """Every acknowledged path reads back as acknowledged; every deleted one is gone."""
    out: list[str] = []
    for path in sorted(ledger.files):
        try:
            got = bytes(await client.read_file(path))
        except Exception as exc:  # reported
            out.append(f"after the faults, {path} is unreadable: {type(exc).__name__}: {exc}")
            continue
        why = ledger.expect(path, got)
        if why is not None:
            out.append(f"after the faults, {why}")
    for path in sorted(ledger.deleted - set(ledger.files)):
        try:
            await client.stat(path)
        except NotFoundError:
            continue
        out.append(f"after the faults, {path} was deleted but is still there")
    return out


__all__ = [
    "MAX_FILE",
    "OPS",
    "REFUSALS",
    "Host",
    "Ledger",
    "check",
    "check_tenants",
    "make_tenants",
    "refused",
    "run_host",
    "until_up",
]
