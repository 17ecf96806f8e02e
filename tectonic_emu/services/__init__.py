"""Background services: scrub and repair (with garbage collection). Stateless, restartable."""

from tectonic_emu.services.repair import DEFAULT_GC_GRACE, RepairReport, collect_garbage, repair
from tectonic_emu.services.scrub import ChunkProblem, ScrubReport, scrub

__all__ = [
    "DEFAULT_GC_GRACE",
    "ChunkProblem",
    "RepairReport",
    "ScrubReport",
    "collect_garbage",
    "repair",
    "scrub",
]
