"""Extended attributes (``tectonic_emu/xattrs.py``): a state machine against a dict, the
limits Linux has, and nothing left behind when a file or directory goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tectonic_emu import Cluster
from tectonic_emu.bridge import Bridge
from tectonic_emu.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NoAttributeError,
    NotPermittedError,
    NotSupportedError,
)
from tectonic_emu.metadata.layers import xattr_prefix
from tectonic_emu.xattrs import CREATE, REPLACE, SIZE_MAX

from .conftest import make_cluster, run_with

PATHS = st.sampled_from(["/f", "/d"])
NAMES = st.sampled_from(["user.a", "user.b", "user.ü"])
VALUES = st.binary(max_size=40)
FLAGS = st.sampled_from([0, CREATE, REPLACE])


class XattrMachine(RuleBasedStateMachine):
    """Random set (plain, XATTR_CREATE, XATTR_REPLACE) and remove on a file and a directory
    of a real cluster (through a ``Bridge``), against a dict; every listing and value
    compared after each step."""

    bridge: Bridge

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[tuple[str, str], bytes] = {}

    def call(self, coro: Any) -> Any:
        return self.bridge.call(coro)

    @rule(path=PATHS, name=NAMES, value=VALUES, flags=FLAGS)
    def set(self, path: str, name: str, value: bytes, flags: int) -> None:
        cl, key = self.bridge.client, (path, name)
        if flags == CREATE and key in self.model:
            with pytest.raises(AlreadyExistsError):
                self.call(cl.setxattr(path, name, value, flags))
        elif flags == REPLACE and key not in self.model:
            with pytest.raises(NoAttributeError):
                self.call(cl.setxattr(path, name, value, flags))
        else:
            self.call(cl.setxattr(path, name, value, flags))
            self.model[key] = value

    @rule(path=PATHS, name=NAMES)
    def remove(self, path: str, name: str) -> None:
        cl = self.bridge.client
        if (path, name) in self.model:
            self.call(cl.removexattr(path, name))
            del self.model[(path, name)]
        else:
            with pytest.raises(NoAttributeError):
                self.call(cl.removexattr(path, name))

    @invariant()
    def same_as_the_dict(self) -> None:
        cl = self.bridge.client
        for p in ("/f", "/d"):
            want = {n: v for (q, n), v in self.model.items() if q == p}
            assert self.call(cl.listxattr(p)) == sorted(want)
            for n, v in want.items():
                assert self.call(cl.getxattr(p, n)) == v

    def teardown(self) -> None:
        for path, name in self.model:
            self.call(self.bridge.client.removexattr(path, name))


def test_user_attributes_behave_as_a_dict(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "cluster", nodes=3, encoding="r1")
    bridge = Bridge(root)
    try:
        bridge.call(bridge.client.write_file("/f", b"x"))
        bridge.call(bridge.client.mkdir("/d"))
        XattrMachine.bridge = bridge
        run_state_machine_as_test(
            XattrMachine, settings=settings(max_examples=20, stateful_step_count=30, deadline=None)
        )
    finally:
        bridge.close()


def test_limits_namespaces_and_nothing_left_behind(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "cluster", nodes=3, encoding="r1")

    async def go(c: Cluster) -> None:
        cl = c.client()
        await cl.write_file("/f", b"x")
        await cl.mkdir("/d")
        before = (await cl.stat("/f")).ctime
        await cl.setxattr("/f", "user.big", b"v" * SIZE_MAX)
        assert (await cl.stat("/f")).ctime >= before
        with pytest.raises(InvalidArgumentError):
            await cl.setxattr("/f", "user.big", b"v" * (SIZE_MAX + 1))
        with pytest.raises(InvalidArgumentError):
            await cl.setxattr("/f", "user." + "n" * 251, b"")
        for other in ("trusted.x", "security.selinux", "system.posix_acl_access", "user."):
            with pytest.raises(NotSupportedError):
                await cl.setxattr("/f", other, b"")
        with pytest.raises(NotPermittedError):
            await cl.setxattr("/f", "user.tectonic.layout", b"[]")
        with pytest.raises(NoAttributeError):
            await cl.getxattr("/f", "user.none")
        await cl.setxattr("/d", "user.x", b"1")
        ids = [(await cl.stat(p)).id for p in ("/f", "/d")]
        await cl.delete("/f")
        await cl.delete("/d")
        for obj in ids:
            assert await c.meta.kv.scan(xattr_prefix(obj)) == []

    run_with(root, go)
