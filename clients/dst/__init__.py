"""Deterministic simulation testing (issue 24, docs/dst.md): the whole cluster in one
process on the virtual clock, the real code on model servers, under seeded fault
schedules; every failing seed replays exactly from its number."""

from clients.dst.run import WORKLOADS, SeedResult, Summary, run_seed, run_seeds

__all__ = ["WORKLOADS", "SeedResult", "Summary", "run_seed", "run_seeds"]
