"""Tenants through the FUSE mount, mounted for real: EDQUOT for a create or a write past a
quota, EXDEV for a rename across namespaces (so ``mv`` copies), usage kept exact."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tectonic_emu import Cluster
from tests.test_fuse import _mounted, watchdog  # noqa: F401 (the fixture)

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)
BLOCK = 64 << 10


async def _in_cluster(root: Path, what: str) -> object:
    async with Cluster.open(root) as cluster:
        c = cluster.client()
        if what == "create":
            await c.mkdir("/free")
            await c.tenants.create("a", ["/a"], quota_files=4, quota_bytes=4 * BLOCK)
            await c.tenants.create("b", ["/b"])
            return None
        t = await c.tenants.get("a")
        return (t.files_used, t.bytes_used), await c.tenants.recount("a")


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    def prepare(root: Path) -> None:
        asyncio.run(_in_cluster(root, "create"))

    with _mounted(tmp_path_factory, "tenants-fuse", nodes=3, encoding="r1", prepare=prepare) as m:
        yield m


def test_quotas_and_namespaces_through_the_mount(mounted: tuple[Path, Path]) -> None:
    root, mnt = mounted
    a, b = mnt / "a", mnt / "b"
    (a / "one").write_bytes(b"1" * 1000)
    (a / "d").mkdir()
    with pytest.raises(OSError) as info:  # the namespace, one, d, two: the fifth is refused
        (a / "two").write_bytes(b"2")
        (a / "three").write_bytes(b"3")
    assert info.value.errno == errno.EDQUOT
    assert sorted(os.listdir(a)) == ["d", "one", "two"]

    # past the bytes: at the write, or at the close
    with pytest.raises(OSError) as info, open(a / "two", "wb") as f:
        f.write(os.urandom(5 * BLOCK))
    assert info.value.errno == errno.EDQUOT
    assert (a / "one").read_bytes() == b"1" * 1000

    with pytest.raises(OSError) as info:
        os.rename(a / "one", b / "one")
    assert info.value.errno == errno.EXDEV
    with pytest.raises(OSError) as info:
        os.link(a / "one", mnt / "free" / "one")
    assert info.value.errno == errno.EXDEV
    # mv copies across (and the copy is the other tenant's), as across file systems.
    subprocess.run(["mv", str(a / "one"), str(b / "one")], check=True)
    assert (b / "one").read_bytes() == b"1" * 1000
    assert not (a / "one").exists()
    with pytest.raises(OSError) as info:  # its contents go; the namespace stays
        shutil.rmtree(a)
    assert info.value.errno == errno.EPERM
    assert os.listdir(a) == []

    used, recount = asyncio.run(_in_cluster(root, "usage"))  # type: ignore[misc]
    assert used == recount == (1, 0)
