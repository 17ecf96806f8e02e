"""Wrong argument types at the public Python API (issue 19, finding 10) get a typed error with
one line naming the argument, what it got and what it takes, never a bare TypeError from deep
inside, and change nothing: ``read('/f', 0.5, 3)``, ``write_file('/s', 'a str')``,
``Checkpointer(world_size='4')``, ``Cluster.create(nodes='9')`` and the rest."""

from __future__ import annotations

import asyncio
import errno
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.checkpoint import Checkpointer
from clients.ckpt_format import CheckpointError
from clients.shardstream import ShardStream
from tectonic_emu import Cluster
from tectonic_emu.client import Client
from tectonic_emu.errors import ArgumentTypeError, TectonicError

from .conftest import make_cluster

# Values of every common kind; each argument is fed those that are not of its own kind.
ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.builds(bytearray, st.binary(max_size=6)),
    st.lists(st.integers(0, 255), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
FITS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "str or None": lambda v: v is None or isinstance(v, str),
    "int or None": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
    "bytes": lambda v: isinstance(v, (bytes, bytearray, memoryview)),
    "buffer": lambda v: isinstance(v, bytearray),
    "mapping": lambda v: isinstance(v, dict),
}


def wrong(kind: str) -> st.SearchStrategy[Any]:
    return ANY.filter(lambda v: not FITS[kind](v))


def refused(exc: BaseException, name: str | None) -> None:
    """A typed EINVAL error (ArgumentTypeError for a type; CheckpointError in the
    checkpoint API, naming ``name``; the older InvalidPathError and UnknownEncodingError
    say what a path or an encoding must be), one line."""
    assert isinstance(exc, TectonicError), repr(exc)
    assert exc.errno == errno.EINVAL, repr(exc)
    line = str(exc)
    assert line and "\n" not in line, line
    if name is not None and isinstance(exc, (ArgumentTypeError, CheckpointError)):
        assert name in line and "not " in line, line


# -- Client ------------------------------------------------------------------------------------
Call = Callable[[Client, Any], Awaitable[Any]]
CLIENT_CALLS: list[tuple[str, str, str, Call]] = [
    ("read offset", "int", "offset", lambda c, v: c.read("/f", v, 3)),
    ("read size", "int", "size", lambda c, v: c.read("/f", 0, v)),
    ("read path", "str", "path", lambda c, v: c.read(v)),
    ("write_file data", "bytes", "data", lambda c, v: c.write_file("/s", v)),
    ("write_file path", "str", "path", lambda c, v: c.write_file(v, b"x")),
    ("read_into offset", "int", "offset", lambda c, v: c.read_into("/f", v, bytearray(4))),
    ("read_into buf", "buffer", "buf", lambda c, v: c.read_into("/f", 0, v)),
    ("read_id_into id", "int", "file_id", lambda c, v: c.read_id_into(v, 0, bytearray(4))),
    ("reader_id id", "int", "file_id", lambda c, v: c.reader_id(v)),
    ("purge id", "int", "file_id", lambda c, v: c.purge(v)),
    ("stat path", "str", "path", lambda c, v: c.stat(v)),
    ("mkdir parents", "bool", "parents", lambda c, v: c.mkdir("/d", parents=v)),
    ("mkdir encoding", "str or None", "encoding", lambda c, v: c.mkdir("/d", encoding=v)),
    ("rename dst", "str", "dst", lambda c, v: c.rename("/f", v)),
    ("rename keep", "bool", "keep_replaced", lambda c, v: c.rename("/f", "/g", keep_replaced=v)),
    ("delete recursive", "bool", "recursive", lambda c, v: c.delete("/f", recursive=v)),
    ("delete keep", "bool", "keep", lambda c, v: c.delete("/f", keep=v)),
    ("FileReader.read_into offset", "int", "offset", lambda c, v: _reader_into(c, v, bytearray(4))),
    ("FileReader.read_into buf", "buffer", "buf", lambda c, v: _reader_into(c, 0, v)),
]


async def _reader_into(c: Client, offset: Any, buf: Any) -> int:
    r = await c.reader("/f")
    return await r.read_into(offset, buf)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[asyncio.Runner, Cluster]]:
    root = make_cluster(tmp_path_factory.mktemp("api") / "c", nodes=3, encoding="r3")
    runner = asyncio.Runner()
    opened = Cluster.open(root)
    cluster = runner.run(opened.__aenter__())
    runner.run(cluster.client().write_file("/f", b"x" * 1000))
    try:
        yield runner, cluster
    finally:
        runner.run(opened.__aexit__(None, None, None))
        runner.close()


@pytest.mark.parametrize(("kind", "name", "call"), [c[1:] for c in CLIENT_CALLS],
                         ids=[c[0] for c in CLIENT_CALLS])  # fmt: skip
def test_client_refuses_wrong_types(
    api: tuple[asyncio.Runner, Cluster], kind: str, name: str, call: Call
) -> None:
    runner, cluster = api
    client = cluster.client()

    @settings(max_examples=40)
    @given(value=wrong(kind))
    def check(value: Any) -> None:
        with pytest.raises(OSError) as e:
            runner.run(call(client, value))
        refused(e.value, name)
        # nothing changed: /f is still there and whole, nothing else appeared
        assert runner.run(client.listdir("/")) == ["f"]
        assert runner.run(client.read_file("/f")) == b"x" * 1000

    check()


def test_the_cases_of_the_issue(api: tuple[asyncio.Runner, Cluster]) -> None:
    runner, cluster = api
    client = cluster.client()
    with pytest.raises(ArgumentTypeError, match=r"read: offset must be an int, not float 0.5"):
        runner.run(client.read("/f", 0.5, 3))  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"data must be bytes-like, not str"):
        runner.run(client.write_file("/s", "a str"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # also a TypeError, as Python's own was
        runner.run(client.read("/f", 0.5, 3))  # type: ignore[arg-type]

    async def append_a_str() -> None:
        async with client.open_writer("/w") as w:
            with pytest.raises(ArgumentTypeError, match=r"append: data must be bytes-like"):
                await w.append("a str")  # type: ignore[arg-type]
            await w.append(b"still open")  # refused before the writer broke

    runner.run(append_a_str())
    assert runner.run(client.read("/w", 0, 10)) == b"still open"
    # the checkpoint API's bad arguments are CheckpointErrors (EINVAL)
    with pytest.raises(CheckpointError, match=r"world_size must be an int, not str '4'"):
        Checkpointer(client, "/ck", world_size="4")  # type: ignore[arg-type]
    where = Path(tempfile.mkdtemp()) / "c"
    with pytest.raises(ArgumentTypeError, match=r"nodes must be an int, not str '9'"):
        Cluster.create(where, nodes="9")  # type: ignore[arg-type]
    assert not where.exists()


# -- Cluster.create and Cluster.open -------------------------------------------------------------
CREATE_ARGS = [
    ("nodes", "int"),
    ("disks_per_node", "int"),
    ("block_size", "int"),
    ("encoding", "str"),
    ("sync", "bool"),
    ("compression", "str"),
    ("metadata", "str"),
    ("metadata_table", "str"),
    ("nic_gbps", "number"),
    ("rtt_ms", "number"),
    ("loss", "number"),
    ("backup_interval", "number"),
    ("backup_keep", "int"),
    ("exist_ok", "bool"),
]


@pytest.mark.parametrize(("name", "kind"), CREATE_ARGS)
def test_cluster_create_refuses_wrong_types(tmp_path: Path, name: str, kind: str) -> None:
    @settings(max_examples=25)
    @given(value=wrong(kind))
    def check(value: Any) -> None:
        where = Path(tempfile.mkdtemp(dir=tmp_path)) / "c"
        with pytest.raises(OSError) as e:
            Cluster.create(where, **{name: value})
        refused(e.value, name)
        assert not where.exists()

    check()


@given(value=ANY.filter(lambda v: not isinstance(v, str)))
@settings(max_examples=25)
def test_cluster_create_and_open_refuse_a_path_that_is_no_path(value: Any) -> None:
    with pytest.raises(OSError) as e:
        Cluster.create(value)
    refused(e.value, "path")

    async def go() -> None:
        async with Cluster.open(value):
            pass

    with pytest.raises(OSError) as e2:
        asyncio.run(go())
    refused(e2.value, "path")


# -- Checkpointer and ShardStream ----------------------------------------------------------------
CKPT_ARGS = [
    ("world_size", "int"),
    ("keep_last", "int"),
    ("timeout", "number"),
    ("part_bytes", "int"),
    ("writers", "int"),
    ("encoding", "str"),
]


@pytest.mark.parametrize(("name", "kind"), CKPT_ARGS)
def test_checkpointer_refuses_wrong_types(
    api: tuple[asyncio.Runner, Cluster], name: str, kind: str
) -> None:
    client = api[1].client()
    optional = name in ("keep_last", "encoding")

    @settings(max_examples=25)
    @given(value=wrong(kind).filter(lambda v: not (optional and v is None)))
    def check(value: Any) -> None:
        kw: dict[str, Any] = {"world_size": 2, name: value}
        with pytest.raises(OSError) as e:
            Checkpointer(client, "/ck", **kw)
        refused(e.value, name)

    check()


SAVE_CALLS: list[tuple[str, str, str | None, Callable[[Checkpointer, Any], Awaitable[Any]]]] = [
    ("save step", "int", "step", lambda k, v: k.save(v, 0, {"a": b"x"})),
    ("save rank", "int", None, lambda k, v: k.save(1, v, {"a": b"x"})),
    ("save state", "mapping", "state", lambda k, v: k.save(1, 0, v)),
    ("save incremental", "bool", "incremental", lambda k, v: k.save(1, 0, {}, incremental=v)),
    ("save_many states", "mapping", "states", lambda k, v: k.save_many(1, v)),
    ("load rank", "int", "rank", lambda k, v: k.load(v)),
    ("read step", "int", "step", lambda k, v: k.read(v, "a")),
    ("read name", "str", "name", lambda k, v: k.read(1, v)),
    ("load step", "int or None", "step", lambda k, v: k.load(0, v)),
    ("manifest step", "int or None", "step", lambda k, v: k.manifest(v)),
    ("delete step", "int", "step", lambda k, v: k.delete(v)),
]


@pytest.mark.parametrize(("kind", "name", "call"), [c[1:] for c in SAVE_CALLS],
                         ids=[c[0] for c in SAVE_CALLS])  # fmt: skip
def test_checkpointer_calls_refuse_wrong_types(
    api: tuple[asyncio.Runner, Cluster],
    kind: str,
    name: str | None,
    call: Callable[[Checkpointer, Any], Awaitable[Any]],
) -> None:
    runner, cluster = api
    ckpt = Checkpointer(cluster.client(), "/ck", world_size=1)

    @settings(max_examples=25)
    @given(value=wrong(kind))
    def check(value: Any) -> None:
        with pytest.raises(OSError) as e:
            runner.run(call(ckpt, value))
        refused(e.value, name)

    check()
    assert runner.run(ckpt.steps()) == []


STREAM_ARGS = ["rank", "world_size", "batch_size", "seed", "epoch", "prefetch", "shuffle_rows"]


@pytest.mark.parametrize("name", STREAM_ARGS)
def test_shard_stream_refuses_wrong_types(api: tuple[asyncio.Runner, Cluster], name: str) -> None:
    client = api[1].client()

    @settings(max_examples=25)
    @given(value=wrong("int").filter(lambda v: not (name == "shuffle_rows" and v is None)))
    def check(value: Any) -> None:
        kw: dict[str, Any] = {"rank": 0, "world_size": 1, "batch_size": 4, "seed": 0, "epoch": 0}
        kw[name] = value
        with pytest.raises(OSError) as e:
            ShardStream(client, "/ds", **kw)
        refused(e.value, name)

    check()
