"""Background services: scrub and repair (with garbage collection). Stateless, restartable."""

from tectonic_emu.services.garbage import (
    DEFAULT_GC_GRACE,
    GarbageReport,
    check_grace,
    collect_garbage,
    garbage_pass,
)
from tectonic_emu.services.repair import RepairReport, repair
from tectonic_emu.services.scrub import ChunkProblem, ScrubReport, scrub

__all__ = [
    "DEFAULT_GC_GRACE",
    "ChunkProblem",
    "GarbageReport",
    "RepairReport",
    "ScrubReport",
    "check_grace",
    "collect_garbage",
    "garbage_pass",
    "repair",
    "scrub",
]
