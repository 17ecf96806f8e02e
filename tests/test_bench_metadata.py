"""``bench metadata``: tiny runs of every backend, checked against the documented schema, and
checked to have really done (and undone) the operations they report."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat as stat_mod
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import jsonschema
import pytest

from bench import metadata
from bench.metadata import (
    DEFAULT_BACKENDS,
    PHASES,
    SCHEMA,
    MetadataBench,
    MetaOps,
    files_per_rank,
    plot,
    run_metadata_bench,
    table,
)
from tectonic_emu.metadata.layers import dir_key
from tectonic_emu.metadata.records import ROOT_DIR_ID
from tectonic_emu.metadata.snapshot import CLUSTER_KEY

RANKS = (1, 4, 16)
FILES_TOTAL = 32
MIN_FILES = 2


def _run(
    tmp: Path,
    backends: tuple[str, ...],
    ranks: tuple[int, ...] = RANKS,
    postgres_url: str | None = None,
) -> MetadataBench:
    log: list[tuple[str, float | None]] = []

    def step(text: str, fraction: float | None = None) -> None:
        log.append((text, fraction))

    result = asyncio.run(
        run_metadata_bench(
            directory=tmp,
            ranks=ranks,
            backends=backends,
            files_total=FILES_TOTAL,
            min_files_per_rank=MIN_FILES,
            postgres_url=postgres_url,
            step=step,
        )
    )
    assert log, "step() is called"
    # The phases move the bar (the total is known); starting a backend only names it.
    fractions = [f for text, f in log if not text.endswith(": starting")]
    assert None not in fractions and fractions == sorted(fractions) and fractions[0] == 0
    assert len(fractions) == len(backends) * len(ranks) * len(PHASES) and fractions[-1] < 1
    assert list(tmp.iterdir()) == [], "the work directory is removed"
    return result


def _check(result: MetadataBench, backends: tuple[str, ...], ranks: tuple[int, ...]) -> None:
    doc = result.to_dict()
    jsonschema.validate(doc, SCHEMA)
    assert doc["sqlite"] and doc["python"] and doc["cpu_count"] >= 1
    assert set(doc["durability"]) == set(backends)
    assert [(p["backend"], p["ranks"]) for p in doc["points"]] == [
        (b, r) for b in backends for r in ranks
    ]
    for p in doc["points"]:
        f = files_per_rank(FILES_TOTAL, p["ranks"], MIN_FILES)
        assert p["files_per_rank"] == f
        assert p["ops"] == dict.fromkeys(PHASES, p["ranks"] * f)
        assert all(p["ops_s"][ph] > 0 for ph in PHASES), p
        assert all(len(p["seconds"][ph]) == 1 for ph in PHASES)
        assert p["files_left"] == 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> MetadataBench:
    return _run(tmp_path_factory.mktemp("md"), DEFAULT_BACKENDS)


def test_tiny_run_matches_schema(tiny: MetadataBench) -> None:
    _check(tiny, DEFAULT_BACKENDS, RANKS)
    assert table(tiny).row_count == len(DEFAULT_BACKENDS) * len(RANKS)


def test_postgresql_backend_beside_sqlite(tmp_path: Path, postgres_url: str) -> None:
    """The PostgreSQL backend (a cluster created with --metadata, on the session's server)
    measured in the same run as SQLite, every file created, found and deleted."""
    backends = ("sqlite", "postgresql")
    result = _run(tmp_path, backends, (1, 4), postgres_url=postgres_url)
    _check(result, backends, (1, 4))
    assert "PostgreSQL" in result.to_dict()["durability"]["postgresql"]


def test_plot_writes_pngs(tiny: MetadataBench, tmp_path: Path) -> None:
    paths = plot(tiny, tmp_path / "plots")
    assert [p.name for p in paths] == [f"metadata-{ph}.png" for ph in PHASES]
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


class CountingOps(MetaOps):
    """Counts the calls that reach a backend, beside the bench's own counters."""

    def __init__(self, inner: MetaOps) -> None:
        self.inner = inner
        self.durability = inner.durability
        self.calls: Counter[str] = Counter()

    def set_ranks(self, ranks: int) -> None:
        self.inner.set_ranks(ranks)

    async def mkdir(self, path: str) -> None:
        self.calls["mkdir"] += 1
        await self.inner.mkdir(path)

    async def rmdir(self, path: str) -> None:
        self.calls["rmdir"] += 1
        await self.inner.rmdir(path)

    async def create(self, path: str) -> None:
        self.calls["create"] += 1
        await self.inner.create(path)

    async def stat(self, path: str) -> None:
        self.calls["stat"] += 1
        await self.inner.stat(path)

    async def listdir(self, path: str) -> list[str]:
        self.calls["list"] += 1
        return await self.inner.listdir(path)

    async def delete(self, path: str) -> None:
        self.calls["delete"] += 1
        await self.inner.delete(path)

    async def files_left(self) -> int:
        return await self.inner.files_left()


def test_operations_really_happen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every create, stat and delete reaches the client, and the metadata holds nothing but
    the root directory afterwards."""
    counted: list[CountingOps] = []
    keys_after: list[tuple[bytes, bytes]] = []

    @asynccontextmanager
    async def counting(work: Path) -> AsyncIterator[MetaOps]:
        async with metadata.BACKEND_FACTORIES["memory"](work) as inner:
            ops = CountingOps(inner)
            counted.append(ops)
            yield ops
            assert isinstance(inner, metadata.ClientOps)
            keys_after.extend(await inner.client.meta.kv.scan(b""))

    monkeypatch.setitem(metadata.BACKEND_FACTORIES, "counting", counting)
    result = _run(tmp_path, ("counting",))
    _check(result, ("counting",), RANKS)
    files = sum(r * files_per_rank(FILES_TOTAL, r, MIN_FILES) for r in RANKS)
    (ops,) = counted
    assert ops.calls["create"] == ops.calls["stat"] == ops.calls["delete"] == files
    # one timed listing per rank, one untimed emptiness check per rank after delete
    assert ops.calls["list"] == 2 * sum(RANKS)
    assert ops.calls["mkdir"] == ops.calls["rmdir"] == 1 + sum(r + 1 for r in RANKS)
    # the root directory's record and the cluster's identity alone
    assert sorted(k for k, _ in keys_after if k != CLUSTER_KEY) == [dir_key(ROOT_DIR_ID)]


@pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)
def test_mount_backend(tmp_path: Path) -> None:
    result = _run(tmp_path, ("mount",), ranks=(1, 4))
    _check(result, ("mount",), (1, 4))
    with open("/proc/mounts") as f:
        assert str(tmp_path) not in f.read(), "no mount is left behind"


@pytest.mark.parametrize(
    ("backend", "kind"), [("fuse-floor", "mfusepy"), ("fuse-raw-floor", "raw")]
)
def test_fuse_floor_backends(tmp_path: Path, backend: str, kind: str) -> None:
    """The daemons under the mount's floor answer every call the bench makes, keep nothing,
    and leave no mount behind."""
    from bench import fuse_floor

    reason = fuse_floor.why_not(kind)
    if reason is not None:
        pytest.skip(reason)
    result = _run(tmp_path, (backend,), ranks=(1, 4))
    _check(result, (backend,), (1, 4))
    assert "nothing else" in result.durability[backend]
    with open("/proc/mounts") as f:
        assert str(tmp_path) not in f.read(), "no mount is left behind"


@pytest.mark.parametrize("kind", ["mfusepy", "raw"])
def test_fuse_floor_daemons_answer_errors_as_a_file_system_does(tmp_path: Path, kind: str) -> None:
    from bench import fuse_floor

    reason = fuse_floor.why_not(kind)
    if reason is not None:
        pytest.skip(reason)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = fuse_floor.start(kind, mnt, tmp_path / "floor.log")
    try:
        (mnt / "d").mkdir()
        os.close(os.open(mnt / "d" / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640))
        st = os.stat(mnt / "d" / "f")
        assert stat_mod.S_ISREG(st.st_mode) and st.st_size == 0
        assert os.listdir(mnt / "d") == ["f"]
        with pytest.raises(FileExistsError):
            os.open(mnt / "d" / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        with pytest.raises(OSError) as e:
            os.rmdir(mnt / "d")
        assert e.value.errno == errno.ENOTEMPTY
        with pytest.raises(FileNotFoundError):
            os.unlink(mnt / "d" / "missing")
        os.unlink(mnt / "d" / "f")
        os.rmdir(mnt / "d")
        assert os.listdir(mnt) == []
    finally:
        fuse_floor.stop(proc, mnt)
    assert proc.returncode is not None
    with open("/proc/mounts") as f:
        assert str(mnt) not in f.read()


def test_unknown_backend_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="unknown backend"):
        asyncio.run(run_metadata_bench(directory=tmp_path, backends=("nope",)))


def _point(backend: str, ranks: int, create: float, stat: float) -> metadata.MetadataPoint:
    rates = {"create": create, "stat": stat, "list": 1.0, "delete": 1.0}
    return metadata.MetadataPoint(backend, ranks, 2, dict.fromkeys(PHASES, 2), rates, {}, 0)


def test_targets_name_each_goal_of_issue_22_and_say_whether_it_is_met() -> None:
    """SQLite's rates against their floors, and the mount against JuiceFS at one rank and at
    the most ranks both ran; n/a (None) where the run did not measure what a goal needs."""
    points = [
        _point("sqlite", 1, 2_600, 24_000),
        _point("sqlite", 16, 3_000, 20_000),
        _point("mount", 1, 400, 1_800),
        _point("juicefs", 1, 900, 2_900),
        _point("mount", 16, 900, 6_000),
        _point("juicefs", 16, 400, 3_000),
    ]
    result = MetadataBench([1, 16], ["sqlite", "mount", "juicefs"], 32, 2, 1, {}, points)
    got = {t["name"]: (t["value"], t["met"]) for t in metadata.targets(result)}
    assert got == {
        "client stats/s, sqlite, 1 rank": (24_000, False),
        "durable creates/s, sqlite, 1 rank": (2_600, True),
        "creates/s, sqlite, 1,024 ranks": (None, None),  # not run at 1,024 ranks
        "mount / JuiceFS creates, 1 rank": (0.444, False),
        "mount / JuiceFS stats, 1 rank": (0.621, False),
        "mount / JuiceFS creates, 16 ranks": (2.25, True),
        "mount / JuiceFS stats, 16 ranks": (2.0, True),
    }
    without = MetadataBench([1], ["sqlite"], 32, 2, 1, {}, points[:1])
    assert [t["met"] for t in metadata.targets(without)][3:] == [None, None]
    assert metadata.targets_table(result).row_count == 7
