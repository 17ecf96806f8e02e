"""How a bench reports its progress: ``step(text)`` names the stage it is in, and
``step(text, fraction)`` also says how much of the run is done, so that the bar on stderr
(``bench.cli_common.run_bench``) shows a percentage and a time remaining. A bench that cannot know
its total (``bench train`` searches) names stages only, and the bar pulses.
"""

from __future__ import annotations

from typing import Protocol


class Step(Protocol):
    def __call__(self, text: str, fraction: float | None = None, /) -> None: ...


def no_step(text: str, fraction: float | None = None, /) -> None:
    """The ``step`` of a bench run without a bar (tests, scripts)."""


class Stages:
    """A run of ``total`` stages of about equal length: each call names the next one and
    moves the bar to the share of stages already done."""

    def __init__(self, step: Step, total: int) -> None:
        self.step = step
        self.total = max(1, total)
        self.done = 0

    def __call__(self, text: str) -> None:
        self.step(text, min(1.0, self.done / self.total))
        self.done += 1


__all__ = ["Stages", "Step", "no_step"]
