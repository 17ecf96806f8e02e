"""TrafficGroups and TrafficClasses: what every request says it belongs to.

As in Tectonic (FAST'21, section 4), every request belongs to a *TrafficGroup*, a set of
clients with the same latency and bandwidth needs (a training job's data loaders, its
checkpoint saves). Each group is in one *TrafficClass*:

- ``gold``: latency matters (data loaders feeding accelerators);
- ``silver``: the default;
- ``bronze``: throughput only (checkpoint bursts, repair, bulk copies).

A class has a weight; a group's weight is its class's times its ``share``. Storage nodes
divide each disk's time between the groups with work by weight and lend what an idle
group leaves to whoever has work (``fairqueue.py``). A group's ``rate``, if set, paces its
clients (``pacing.py``), as Tectonic's client-side leaky bucket does.

The group a task runs in is a context variable: tasks inherit it, so everything done inside
``using(group)`` (a ``Checkpointer``'s save, a ``ShardStream``'s reads) is tagged without a
parameter on the node seam. Outside any ``using``, requests are in the process's group
(``set_process_group``: the command line's ``--group``), ``DEFAULT`` unless set.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from tectonic_emu.errors import InvalidArgumentError

#: Each class's weight. Gold's 16 against bronze's 1 gives a gold group up to 16/17 of a
#: disk's time while bronze work waits; whatever gold leaves goes to bronze.
CLASSES: dict[str, float] = {"gold": 16.0, "silver": 4.0, "bronze": 1.0}
MAX_SHARE = 100.0
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


@dataclass(frozen=True, slots=True)
class TrafficGroup:
    """One TrafficGroup: ``name`` (1 to 64 of ``[a-z0-9._-]``), its ``klass`` (a key of
    ``CLASSES``), its ``share`` within the class (0 < share <= 100) and the ``rate`` its
    clients are paced to, in bytes per second (0: not paced). Raises InvalidArgumentError
    for any of these out of range."""

    name: str
    klass: str = "silver"
    share: float = 1.0
    rate: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidArgumentError(
                f"a traffic group's name is 1 to 64 of [a-z0-9._-], not {self.name!r}"
            )
        if self.klass not in CLASSES:
            raise InvalidArgumentError(
                f"a traffic class is one of {', '.join(CLASSES)}, not {self.klass!r}"
            )
        if not (math.isfinite(self.share) and 0 < self.share <= MAX_SHARE):
            raise InvalidArgumentError(
                f"a group's share is in (0, {MAX_SHARE:g}], not {self.share}"
            )
        if not (math.isfinite(self.rate) and self.rate >= 0):
            raise InvalidArgumentError(f"a group's rate is 0 or more bytes/s, not {self.rate}")

    @property
    def weight(self) -> float:
        return CLASSES[self.klass] * self.share

    def encode(self) -> bytes:
        """What a request carries (``docs/wire-protocol.md``): ``name:class:share``. The
        rate stays with the clients."""
        return f"{self.name}:{self.klass}:{self.share:g}".encode("ascii")

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> TrafficGroup:
        """The group ``encode`` wrote; InvalidArgumentError for anything else."""
        try:
            name, klass, share = bytes(raw).decode("ascii").split(":")
            return cls(name, klass, float(share))
        except (UnicodeDecodeError, ValueError) as e:
            raise InvalidArgumentError(f"not a traffic group: {bytes(raw)[:80]!r}") from e

    @classmethod
    def parse(cls, spec: str) -> TrafficGroup:
        """A group from the command line's ``NAME[:CLASS[:SHARE[:RATE]]]``, such as
        ``loader:gold`` or ``ckpt:bronze:1:500e6`` (RATE in bytes/s)."""
        parts = spec.split(":")
        if not 1 <= len(parts) <= 4:
            raise InvalidArgumentError(f"a group is NAME[:CLASS[:SHARE[:RATE]]], not {spec!r}")
        try:
            share = float(parts[2]) if len(parts) > 2 else 1.0
            rate = float(parts[3]) if len(parts) > 3 else 0.0
        except ValueError as e:
            raise InvalidArgumentError(f"a group's share and rate are numbers: {spec!r}") from e
        return cls(parts[0], parts[1] if len(parts) > 1 else "silver", share, rate)


DEFAULT = TrafficGroup("default")
_current: contextvars.ContextVar[TrafficGroup | None] = contextvars.ContextVar(
    "tectonic_traffic_group", default=None
)
_process = DEFAULT  # the group outside any ``using`` (``set_process_group``)


def current() -> TrafficGroup:
    """The group the running task's requests belong to."""
    return _current.get() or _process


def explicit() -> TrafficGroup | None:
    """The group a ``using`` around the running task names, if any."""
    return _current.get()


def set_process_group(group: TrafficGroup) -> None:
    """The group of every request this process makes outside ``using`` (the command line's
    ``--group``: a mount's FUSE threads and every command's tasks)."""
    global _process
    _process = group


@contextlib.contextmanager
def using(group: TrafficGroup | None) -> Iterator[TrafficGroup]:
    """Run the body, and every task it starts, in ``group`` (None: the current one)."""
    if group is None:
        yield current()
        return
    token = _current.set(group)
    try:
        yield group
    finally:
        _current.reset(token)


class HasGroup(Protocol):
    group: TrafficGroup | None


S = TypeVar("S", bound=HasGroup)
P = ParamSpec("P")
T = TypeVar("T")


def grouped(
    method: Callable[Concatenate[S, P], Awaitable[T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """An async method that runs in its object's ``group`` (None: the caller's), as a
    ``Checkpointer`` or a ``ShardStream`` made with ``group=`` does."""

    async def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        with using(self.group):
            return await method(self, *args, **kwargs)

    functools.update_wrapper(run, method)
    return run


__all__ = [
    "CLASSES",
    "DEFAULT",
    "TrafficGroup",
    "current",
    "explicit",
    "grouped",
    "set_process_group",
    "using",
]
