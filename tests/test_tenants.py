"""Tenants and quotas (tectonic_emu/metadata/tenants.py, tectonic_emu/tenancy.py): what is
charged, EDQUOT and EXDEV through the client, fsspec and the CLI, usage against a recount
after a state machine and after a killed writer. The mount's are in test_tenants_mount.py.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tectonic_emu import Cluster
from tectonic_emu.cli import cli
from tectonic_emu.client import Client
from tectonic_emu.errors import (
    AlreadyExistsError,
    CrossTenantError,
    DirectoryNotEmptyError,
    InvalidArgumentError,
    NotFoundError,
    NotPermittedError,
    QuotaExceededError,
)
from tests.conftest import fresh_table

T = TypeVar("T")
BLOCK = 64 << 10


def _cluster(tmp_path: Path, metadata: str = "") -> Path:
    """A fresh r1 cluster of 64 KiB blocks, its metadata in SQLite (or at a PostgreSQL
    URL, in a table of its own)."""
    root = tmp_path / "cluster"
    more = {"metadata": metadata, "metadata_table": fresh_table()} if metadata else {}
    Cluster.create(root, nodes=3, encoding="r1", block_size=BLOCK, **more)  # type: ignore[arg-type]
    return root


@pytest.fixture(params=["sqlite", "postgresql"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A cluster on each metadata backend (the charges are the layers', the same on both)."""
    if request.param == "sqlite":
        return _cluster(tmp_path)
    return _cluster(tmp_path, request.getfixturevalue("postgres_url"))


@asynccontextmanager
async def _client(root: Path) -> AsyncIterator[Client]:
    async with Cluster.open(root) as cluster:
        yield cluster.client()


def _run(root: Path, body: Callable[[Client], Awaitable[T]]) -> T:
    async def main() -> T:
        async with _client(root) as c:
            return await body(c)

    return asyncio.run(main())


async def _usage(c: Client, name: str) -> tuple[int, int]:
    t = await c.tenants.get(name)
    return t.files_used, t.bytes_used


def test_usage_counts_named_files_directories_and_stored_bytes(tmp_path: Path) -> None:
    async def body(c: Client) -> list[tuple[int, int]]:
        await c.mkdir("/proj")
        t = await c.tenants.create("ml", ["/proj/ml", "/data"])
        seen = [(t.files_used, t.bytes_used)]  # the two namespaces' directories
        await c.write_file("/data/a", b"x" * 1000)
        await c.mkdir("/data/sub/deeper", parents=True)
        await c.symlink("a", "/data/link")
        await c.link("/data/a", "/data/sub/a2")  # one file, two names: counted once
        seen.append(await _usage(c, "ml"))
        async with c.open_writer("/proj/ml/sparse") as w:
            await w.append(b"y" * 10)
            await w.append_hole(5 * BLOCK)  # holes are not stored bytes
        seen.append(await _usage(c, "ml"))
        await c.write_file("/other", b"z" * 500)  # outside every namespace: nobody's
        await c.delete("/data/sub", recursive=True)
        seen.append(await _usage(c, "ml"))
        assert await _usage(c, "ml") == await c.tenants.recount("ml")
        return seen

    seen = _run(_cluster(tmp_path), body)
    assert seen[0] == (2, 0)
    assert seen[1] == (2 + 1 + 2 + 1, 1000)  # a, sub, deeper, link (a2 is a)
    assert seen[2] == (7, 1010)
    assert seen[3] == (5, 1010)  # sub, deeper and a2 gone; a stays


def test_a_create_past_the_files_quota_is_edquot_and_changes_nothing(root: Path) -> None:
    async def body(c: Client) -> None:
        await c.tenants.create("t", ["/t"], quota_files=3)
        await c.write_file("/t/a", b"1")
        await c.mkdir("/t/d")
        for make in (
            lambda: c.write_file("/t/b", b"2"),
            lambda: c.mkdir("/t/e"),
            lambda: c.symlink("a", "/t/l"),
            lambda: c.open_writer("/t/w"),
        ):
            with pytest.raises(QuotaExceededError) as info:
                await make()
            assert info.value.errno == errno.EDQUOT
        assert sorted(await c.listdir("/t")) == ["a", "d"]
        assert await _usage(c, "t") == (3, 1) == await c.tenants.recount("t")
        # A rewrite needs no spare file: its new version is nameless until it replaces a.
        await c.write_file("/t/a", b"rewritten")
        assert await c.read_file("/t/a") == b"rewritten"
        assert await _usage(c, "t") == (3, 9)

    _run(root, body)


def test_a_write_past_the_bytes_quota_fails_at_its_block_and_keeps_the_rest(
    root: Path,
) -> None:
    """A writer's blocks commit one by one: the one that would cross the quota fails with
    EDQUOT, its chunks deleted; the blocks before it stay the file's, readable; a whole-file
    write (a new version) leaves the path as it was."""

    async def body(c: Client) -> None:
        await c.tenants.create("t", ["/t"], quota_bytes=3 * BLOCK)
        await c.write_file("/t/keep", b"k" * 100)
        w = await c.open_writer("/t/grow")
        await w.append(b"g" * (2 * BLOCK))
        await w.flush()
        with pytest.raises(QuotaExceededError):
            await w.append(b"h" * (2 * BLOCK))
            await w.flush()
        await w.abort()
        assert await c.read_file("/t/grow") == b"g" * (2 * BLOCK)
        with pytest.raises(QuotaExceededError):
            await c.write_file("/t/keep", b"n" * (2 * BLOCK))
        assert await c.read_file("/t/keep") == b"k" * 100
        assert await _usage(c, "t") == (3, 2 * BLOCK + 100) == await c.tenants.recount("t")
        # Freeing is never refused, and makes room.
        await c.delete("/t/grow")
        await c.write_file("/t/keep", b"n" * (2 * BLOCK))
        assert await _usage(c, "t") == (2, 2 * BLOCK)

    _run(root, body)


def test_a_quota_lowered_below_usage_lets_it_shrink_only(tmp_path: Path) -> None:
    async def body(c: Client) -> None:
        await c.tenants.create("t", ["/t"])
        for i in range(4):
            await c.write_file(f"/t/f{i}", b"x" * 100)
        t = await c.tenants.set_quota("t", files=2, nbytes=150)
        assert (t.quota_files, t.quota_bytes, t.files_used) == (2, 150, 5)
        with pytest.raises(QuotaExceededError):
            await c.write_file("/t/new", b"")
        await c.delete("/t/f0")  # shrinking is allowed, still over
        with pytest.raises(QuotaExceededError):  # a new version needs room beside the old
            await c.write_file("/t/f1", b"y" * 50)
        await c.delete("/t/f1")
        await c.delete("/t/f2")
        assert await _usage(c, "t") == (2, 100)
        await c.write_file("/t/f3", b"y" * 50)  # under the quota again: both fit
        with pytest.raises(QuotaExceededError):
            await c.write_file("/t/f4", b"z")  # the files quota
        t = await c.tenants.set_quota("t", files=None)  # "keep" for bytes
        assert (t.quota_files, t.quota_bytes) == (None, 150)

    _run(_cluster(tmp_path), body)


def test_renames_and_links_across_namespaces_are_exdev(tmp_path: Path) -> None:
    async def body(c: Client) -> None:
        await c.tenants.create("a", ["/a"])
        await c.tenants.create("b", ["/b"])
        await c.write_file("/a/f", b"1")
        await c.mkdir("/a/d")
        await c.write_file("/plain", b"2")
        for src, dst in (
            ("/a/f", "/b/f"),
            ("/a/d", "/b/d"),
            ("/a/f", "/f"),
            ("/plain", "/a/plain"),
            ("/a", "/moved"),  # a namespace's own directory stays where it was made
        ):
            with pytest.raises(CrossTenantError) as info:
                await c.rename(src, dst)
            assert info.value.errno == errno.EXDEV
        with pytest.raises(CrossTenantError):
            await c.link("/a/f", "/b/f")
        with pytest.raises(NotPermittedError):
            await c.delete("/a", recursive=True)
        await c.rename("/a/f", "/a/d/f")  # inside one namespace: as ever
        assert await c.listdir("/a/d") == ["f"]
        assert await _usage(c, "a") == await c.tenants.recount("a") == (3, 1)

    _run(_cluster(tmp_path), body)


def test_tenant_management_errors(tmp_path: Path) -> None:
    async def body(c: Client) -> None:
        await c.mkdir("/x/y", parents=True)
        await c.tenants.create("t", ["/t"])
        with pytest.raises(AlreadyExistsError):
            await c.tenants.create("t", ["/u"])
        with pytest.raises(AlreadyExistsError):
            await c.tenants.create("u", ["/x"])  # namespaces are made new
        with pytest.raises(CrossTenantError):
            await c.tenants.create("u", ["/t/inner"])  # no tenant inside another's
        with pytest.raises(NotFoundError):
            await c.tenants.create("u", ["/missing/ns"])
        for bad in ("", "-x", "a/b", "x" * 65, "sp ace"):
            with pytest.raises(InvalidArgumentError):
                await c.tenants.create(bad, ["/ok"])
        with pytest.raises(InvalidArgumentError):
            await c.tenants.create("u", [])
        with pytest.raises(InvalidArgumentError):
            await c.tenants.create("u", ["/v"], quota_files=-1)
        with pytest.raises(QuotaExceededError):  # two namespaces are two directories
            await c.tenants.create("u", ["/v", "/w"], quota_files=1)
        assert not await c.exists("/v")  # nothing of a refused create is left
        with pytest.raises(NotFoundError):
            await c.tenants.get("u")
        await c.write_file("/t/f", b"")
        with pytest.raises(DirectoryNotEmptyError):
            await c.tenants.remove("t")
        await c.delete("/t/f")
        await c.tenants.remove("t")
        assert not await c.exists("/t")
        assert await c.tenants.list() == []
        with pytest.raises(NotFoundError):
            await c.tenants.remove("t")

    _run(_cluster(tmp_path), body)


def test_fsspec_gets_edquot(tmp_path: Path) -> None:
    from clients.fsspec import TectonicFileSystem

    root = _cluster(tmp_path)
    _run(root, lambda c: c.tenants.create("t", ["/t"], quota_bytes=1000))
    fs = TectonicFileSystem(cluster=str(root))
    try:
        fs.pipe("/t/small", b"x" * 10)
        with pytest.raises(OSError) as info:
            fs.pipe("/t/big", b"x" * 5000)
        assert info.value.errno == errno.EDQUOT
        assert fs.cat("/t/small") == b"x" * 10
        assert not fs.exists("/t/big")
    finally:
        fs.close() if hasattr(fs, "close") else None


def test_cli_tenant_commands(tmp_path: Path) -> None:
    root = _cluster(tmp_path)
    runner = CliRunner()

    def call(*args: str) -> Any:
        res = runner.invoke(cli, [*args[:2], "--cluster", str(root), *args[2:]])
        return res

    res = call("tenant", "create", "ml", "/ml", "/data", "--files", "10", "--bytes", "1MiB")
    assert res.exit_code == 0, res.output
    assert "2 of 10" in res.output and "1 MiB" in res.output
    res = call("tenant", "quota", "ml", "--files", "none", "--json")
    got = json.loads(res.output)
    assert got == [
        {
            "name": "ml",
            "namespaces": ["/ml", "/data"],
            "quota_files": None,
            "quota_bytes": 1 << 20,
            "files_used": 2,
            "bytes_used": 0,
        }
    ]
    res = call("tenant", "ls")
    assert res.exit_code == 0 and all(len(line) <= 80 for line in res.output.splitlines())
    res = call("cluster", "status", "--json")
    assert json.loads(res.output)["tenants"] == [
        {
            "name": "ml",
            "files_used": 2,
            "bytes_used": 0,
            "quota_files": None,
            "quota_bytes": 1 << 20,
        }
    ]
    assert "tenant ml: 2 files, 0 B" in call("cluster", "status").output
    for bad in (("--files", "-3"), ("--files", "lots"), ("--bytes", "much")):
        res = call("tenant", "quota", "ml", *bad)
        assert res.exit_code != 0
    res = call("tenant", "rm", "ml")
    assert res.exit_code == 0, res.output
    assert call("tenant", "ls").output.strip() == "no tenants"


# -- usage stays a recount: a state machine, and a writer killed mid-file -----------------
class TenantMachine(RuleBasedStateMachine):
    """Files in two tenants' namespaces and outside them: writes (several at once), appends
    by writers left unclosed (abandoned, as a killed process leaves them), rewrites,
    deletes, renames within a namespace and refused ones across, hard links. The model:
    each tenant's named files and their sizes; after every step the tenant's usage equals
    both the model and a recount of the records."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dirs: list[Path] = []
        self.files: dict[str, int] = {}  # path -> size, every tenant's named regular file
        self.links: dict[str, str] = {}  # second name -> first
        self.n = 0

    @initialize()
    def start(self) -> None:
        import tempfile

        base = Path(tempfile.mkdtemp(prefix="tenant-sm-"))
        self.dirs.append(base)
        Cluster.create(base / "c", nodes=3, encoding="r1", block_size=BLOCK)
        self.cluster = Cluster.open(base / "c")
        self.c = self.loop.run_until_complete(self.cluster.__aenter__()).client()
        self.do(self.c.tenants.create("a", ["/a"], quota_bytes=6 * BLOCK))
        self.do(self.c.tenants.create("b", ["/b"]))

    def do(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        import shutil

        if hasattr(self, "cluster"):
            self.loop.run_until_complete(self.cluster.__aexit__(None, None, None))
        self.loop.close()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)

    def _new(self, ns: str) -> str:
        self.n += 1
        return f"/{ns}/f{self.n}"

    def _used(self, ns: str) -> int:
        return sum(size for path, size in self.files.items() if path.startswith(f"/{ns}/"))

    @rule(
        ns=st.sampled_from("ab"), sizes=st.lists(st.integers(0, 2 * BLOCK), min_size=1, max_size=3)
    )
    def write_at_once(self, ns: str, sizes: list[int]) -> None:
        paths = [self._new(ns) for _ in sizes]

        async def one(path: str, size: int) -> BaseException | None:
            try:
                await self.c.write_file(path, os.urandom(size))
            except QuotaExceededError as e:
                return e
            return None

        async def all_at_once() -> list[BaseException | None]:
            return await asyncio.gather(*(one(p, s) for p, s in zip(paths, sizes, strict=True)))

        results = self.do(all_at_once())
        for path, size, err in zip(paths, sizes, results, strict=True):
            if err is None:
                self.files[path] = size
            else:
                assert ns == "a"

    @rule(ns=st.sampled_from("ab"), size=st.integers(1, 2 * BLOCK), close=st.booleans())
    def append_and_maybe_abandon(self, ns: str, size: int, close: bool) -> None:
        """A writer that flushes and then closes, or is left as a killed one leaves it."""
        path = self._new(ns)
        w = self.do(self.c.open_writer(path))
        self.files[path] = 0
        try:
            self.do(w.append(os.urandom(size)))
            self.do(w.flush())
            self.files[path] = size
        except QuotaExceededError:
            assert ns == "a"
        if close:
            self.do(w.close()) if self.files[path] == size else self.do(w.abort())
        # else: never closed; a later writer or a delete takes it over

    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        path = data.draw(st.sampled_from(sorted(self.files)))
        self.do(self.c.delete(path))
        size = self.files.pop(path)
        for second, first in list(self.links.items()):
            if first == path:  # the file lives on under its other name
                self.files[second] = size
                del self.links[second]
            elif second == path:
                del self.links[second]

    @precondition(lambda self: self.files)
    @rule(data=st.data(), size=st.integers(0, 2 * BLOCK))
    def rewrite(self, data: st.DataObject, size: int) -> None:
        path = data.draw(st.sampled_from(sorted(self.files)))
        if path in self.links or path in self.links.values():
            return  # (a rewrite by path replaces one name only: not modelled)
        try:
            self.do(self.c.write_file(path, os.urandom(size)))
            self.files[path] = size
        except QuotaExceededError:
            assert path.startswith("/a/")

    @precondition(lambda self: self.files)
    @rule(data=st.data(), across=st.booleans())
    def rename(self, data: st.DataObject, across: bool) -> None:
        path = data.draw(st.sampled_from(sorted(self.files)))
        if path in self.links or path in self.links.values():
            return
        ns = path[1]
        dst = self._new(("b" if ns == "a" else "a") if across else ns)
        if across:
            with pytest.raises(CrossTenantError):
                self.do(self.c.rename(path, dst))
            return
        self.do(self.c.rename(path, dst))
        self.files[dst] = self.files.pop(path)

    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def hard_link(self, data: st.DataObject) -> None:
        path = data.draw(st.sampled_from(sorted(self.files)))
        if path in self.links or path in self.links.values():
            return
        second = self._new(path[1])
        self.do(self.c.link(path, second))
        self.links[second] = path

    @invariant()
    def usage_is_the_model_and_a_recount(self) -> None:
        if not hasattr(self, "c"):
            return
        for ns in "ab":
            named = 1 + sum(1 for p in self.files if p.startswith(f"/{ns}/"))
            want = (named, self._used(ns))
            assert self.do(_usage(self.c, ns)) == want
            assert self.do(self.c.tenants.recount(ns)) == want


TenantMachine.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_usage_state_machine = TenantMachine.TestCase


def test_usage_is_a_recount_after_a_writer_is_killed(tmp_path: Path) -> None:
    """A process writing files into a namespace, flushing each, SIGKILLed mid-way: what it
    committed is charged, nothing else; usage equals a recount when the cluster reopens."""
    root = _cluster(tmp_path)
    _run(root, lambda c: c.tenants.create("t", ["/t"]))
    script = (
        "import asyncio, os, sys\n"
        "from tectonic_emu import Cluster\n"
        "async def main():\n"
        "    async with Cluster.open(sys.argv[1]) as cl:\n"
        "        c = cl.client()\n"
        "        for i in range(10_000):\n"
        "            w = await c.open_writer(f'/t/f{i}')\n"
        "            await w.append(os.urandom(3 * 65536 + 17))\n"
        "            await w.flush()\n"
        "            print(i, flush=True)\n"
        "            if i % 2:\n"
        "                await w.close()\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    done = 0
    while done < 6 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        done = int(line) + 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert done >= 6, "the writer made too little progress"

    async def check(c: Client) -> None:
        used, recount = await _usage(c, "t"), await c.tenants.recount("t")
        assert used == recount
        files, nbytes = used
        assert files >= 1 + done  # its namespace, and every file it flushed
        assert nbytes >= done * (3 * 65536 + 17)

    _run(root, check)
