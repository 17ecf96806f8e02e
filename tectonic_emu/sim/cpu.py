"""Client CPU: the data path's per-byte work, charged to a host's cores.

The real code counts its work where it does it (``coding/work.py``): CRC32C, Reed-Solomon
encode and decode, the digests of incremental checkpoints, each frame's MAC and socket
copy, and copies of payloads into fresh memory (a load's values; a server's page cache,
charged to the server's CPU where it has one: ``Hardware.embedded``). A ``HostCpu`` is
one client host's ``Tally``. Each time a job settles (the end of an ``offload``, of an
executor job, of a frame a ``ModelNode`` sends or receives), the job's work takes
``CpuModel.seconds(work)`` of one core, first come first served over the host's ``cores``:
the real client hands this work to a pool of as many threads as cores.

What is not charged: the Python that runs the client on the event loop (its cost is per
call, not per byte, and is this machine's, not a cluster's), compression (a projection's
payloads are incompressible, and ``auto`` then costs one small sample), and the CPU of
servers on hosts of their own.

``CpuModel.measure()`` times each kind of work here, on this machine's libraries, for the
``this-machine`` preset; ``ASSUMED_SERVER_CORE`` is a figure for a modern server core.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from tectonic_emu.coding import work
from tectonic_emu.sim.resources import QueueResource


@dataclass(frozen=True, slots=True)
class CpuModel:
    """``cores`` cores, each doing ``gbps[kind]`` GB/s of each kind of work in
    ``work.KINDS`` (bytes of input per second of one core)."""

    cores: int
    gbps: Mapping[str, float] = field(hash=False)
    source: str = ""

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"a host has at least one core, not {self.cores}")
        missing = [k for k in work.KINDS if not self.gbps.get(k, 0) > 0]
        if missing:
            raise ValueError(f"a CPU model needs a positive rate for {', '.join(missing)}")

    def seconds(self, done: Mapping[str, int]) -> float:
        """Core-seconds that ``done`` (bytes per kind) takes."""
        return sum(n / (self.gbps[kind] * 1e9) for kind, n in done.items())

    @classmethod
    def measure(cls, *, cores: int | None = None, repeat: int = 5) -> CpuModel:
        """Each kind timed here on 8 MiB of random bytes (the best of ``repeat`` calls),
        with ``cores`` (default: this machine's) cores."""
        data = os.urandom(_MEASURE_BYTES)
        return cls(
            cores or os.cpu_count() or 1,
            {kind: _gbps(fn, repeat) for kind, fn in _measurements(data).items()},
            "measured on this machine (sim/cpu.py, CpuModel.measure)",
        )


class HostCpu(work.Tally):
    """One client host's cores: the work of each job settled is charged in its turn."""

    def __init__(self, model: CpuModel, *, name: str = "") -> None:
        super().__init__()
        self.model = model
        self.cores = QueueResource(1.0, servers=model.cores, name=name)
        self._per_byte = {kind: 1 / (rate * 1e9) for kind, rate in model.gbps.items()}

    def add(self, kind: str, nbytes: int) -> None:
        super().add(kind, nbytes)
        self.owed += nbytes * self._per_byte[kind]

    def claim(self) -> Awaitable[None]:
        owed, self.owed = self.owed, 0.0
        return self.cores.begin(owed)


# A current server core, for presets without a measurement of their own. ASSUMED, not
# measured: about twice what CpuModel.measure() gives on this machine's cores (a small cloud
# VM, docs/simulate.md), for the same libraries.
ASSUMED_SERVER_CORE: Mapping[str, float] = {
    "crc32c": 20.0,
    "rs-encode": 12.0,
    "rs-decode": 6.0,
    "blake2b": 1.0,
    "wire": 6.0,
    "copy": 3.0,
}

_MEASURE_BYTES = 8 << 20


def _gbps(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm: tables, pages
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return _MEASURE_BYTES / max(best, 1e-9) / 1e9


def _measurements(data: bytes) -> dict[str, Callable[[], object]]:
    """One call of each kind of work on ``data``, as the data path makes it."""
    from tectonic_emu.chunkstore.auth import FrameMac
    from tectonic_emu.coding import Encoding, codec_for, crc32c

    rs = codec_for(Encoding.parse("rs-6-3"))
    mac = FrameMac(bytes(32))
    survivors = {i: c for i, c in enumerate(rs.encode(data)) if i >= 3}  # 3 data chunks lost
    # Copies into fresh memory, kept: a load's values and a node's page cache are new pages
    # (1.3 GB/s here, against 5-9 GB/s into memory just freed).
    kept: list[bytes] = []

    def wire() -> object:  # a frame's MAC, and the copy a socket send makes
        return mac.tag(mac.next_seq(), [data]), bytearray(data)

    return {
        "crc32c": lambda: crc32c(data),
        "rs-encode": lambda: rs.encode(data),
        "rs-decode": lambda: rs.decode(survivors, len(data)),
        "blake2b": lambda: hashlib.blake2b(data, digest_size=16).digest(),
        "wire": wire,
        "copy": lambda: kept.append(bytes(memoryview(data))),
    }


__all__ = ["ASSUMED_SERVER_CORE", "CpuModel", "HostCpu"]
