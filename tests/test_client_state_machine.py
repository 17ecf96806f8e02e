"""Random operations on the async client, checked against a plain model after every step.

The model is a dict of files (path -> bytes) and a dict of directories (path -> the encoding
new files below inherit). Every namespace call is predicted exactly, errors included (the
error's type is compared). Writers are the one place where the model allows a range: full
blocks an open writer handed to its pipeline commit in the background, so between flushes a
reader sees the flushed bytes plus any whole number of those blocks (a block is ``BLOCK`` bytes
for a replicated file, D x ``BLOCK`` for an RS file); each read narrows the model to what was
seen (the committed prefix only grows). A hole (``append_hole``) flushes, then its zeros
are committed at once. Sizes near block edges are drawn in blocks of the
encoding the file ends up with.

Node faults stay within what the data survives, decided from the model alone (hypothesis needs
the same draws on a replay, so nothing that depends on timing or placement may steer them): at
most ``MAX_STOPPED`` nodes are down, so every write finds the live nodes it needs (see
``DataPath.min_live_nodes``); no node stops while a file would lose more chunks than its
encoding tolerates (r1 tolerates none: while an r1 file exists, nodes only come back; a block
written while nodes were down may have two chunks on one node, see ``safe_down``); and none
stops while blocks are in flight, since those may land on any node.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tectonic_emu import (
    AlreadyExistsError,
    Client,
    Cluster,
    ClusterConfig,
    DirectoryNotEmptyError,
    Encoding,
    FencedWriterError,
    FileWriter,
    InvalidArgumentError,
    InvalidPathError,
    IsADirectoryError_,
    NotADirectoryError_,
    NotFoundError,
    SealedFileError,
    TectonicError,
    WriterClosedError,
)
from tectonic_emu.services import DEFAULT_GC_GRACE, repair, scrub

T = TypeVar("T")
V = TypeVar("V")

BLOCK = 16 << 10  # the cluster's block size: every chunk's
NODES = 9
DEFAULT_ENCODING = "rs-6-3"
ENCODINGS = ("r1", "r3", "rs-3-3", "rs-6-3")
CONFIG = ClusterConfig(nodes=NODES, encoding=DEFAULT_ENCODING, block_size=BLOCK, sync=False)
# rs-6-3 needs 7 live nodes of 9 to accept a write: with at most 2 down every write succeeds.
MAX_STOPPED = 2
MAX_WRITERS = 2

names = st.sampled_from(("a", "b", "c"))
paths = st.lists(names, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
encodings = st.one_of(st.none(), st.sampled_from(ENCODINGS))


@cache
def block_of(encoding: str) -> int:
    """Bytes per block of an ``encoding`` file: ``BLOCK``, or D x ``BLOCK`` for rs-D-P."""
    return CONFIG.block_size_for(Encoding.parse(encoding))


@dataclass(frozen=True)
class Payload:
    """Bytes to write, drawn before the encoding they land in is known: ``size`` is a byte
    count, or (blocks, delta) for ``blocks`` blocks of that encoding plus ``delta`` bytes."""

    size: int | tuple[int, int]
    seed: int
    compressible: bool

    def make(self, encoding: str) -> bytes:
        size = self.size
        if isinstance(size, tuple):
            size = size[0] * block_of(encoding) + size[1]
        rnd = random.Random(self.seed)
        if not self.compressible:
            return rnd.randbytes(size)
        line = b"step %d loss %.4f lr 3e-4\n" % (rnd.randrange(1000), rnd.random())
        return (line * (size // len(line) + 1))[:size]


sizes = st.one_of(
    st.integers(0, 80 << 10),
    st.sampled_from((1, (1, -1), (1, 0), (1, 1), (2, 0), (5, -1))),
)
payloads = st.builds(Payload, sizes, st.integers(0, 1 << 16), st.booleans())
appends = st.builds(
    Payload,
    st.one_of(st.integers(0, 40 << 10), st.sampled_from(((1, -1), (1, 0), (1, 1)))),
    st.integers(0, 1 << 16),
    st.booleans(),
)


@dataclass(eq=False)
class FileModel:
    encoding: str
    durable: bytes  # bytes known committed
    pending: bytes = b""  # appended since the last flush; whole blocks of it may be committed
    sealed: bool = True
    writer: WriterModel | None = None
    unflushed: int = 0  # bytes appended since the last flush (``pending`` before any read)
    safe_down: int = NODES  # nodes that may be down with every block still readable

    @property
    def block(self) -> int:
        return block_of(self.encoding)

    def candidates(self) -> list[bytes]:
        """Every content a reader may see now."""
        whole = len(self.pending) // self.block
        return [self.durable + self.pending[: k * self.block] for k in range(whole + 1)]

    def saw(self, content: bytes) -> None:
        """Narrow the model to ``content``, read just now."""
        assert content in self.candidates(), (len(content), len(self.durable), len(self.pending))
        self.pending = self.pending[len(content) - len(self.durable) :]
        self.durable = content


@dataclass(eq=False)
class WriterModel:
    writer: FileWriter
    file: FileModel

    @property
    def fenced(self) -> bool:
        return self.file.writer is not self

    @property
    def in_flight(self) -> bool:
        """Full blocks may still be on their way to the nodes (uncommitted chunks exist)."""
        return not self.fenced and self.file.unflushed >= self.file.block


def safe_down(encoding: str, stopped: int) -> int:
    """How many nodes may fail with a block still readable, if it was written while
    ``stopped`` nodes were down. With fewer live nodes than chunks, ``DataPath.place`` puts
    two chunks (never more) on some nodes; losing such a node costs two chunks."""
    enc = Encoding.parse(encoding)
    doubled = max(0, enc.width - (NODES - stopped))
    k = 0
    while 2 * min(k + 1, doubled) + max(0, k + 1 - doubled) <= enc.tolerance:
        k += 1
    return k


def parts_of(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def join(parts: list[str]) -> str:
    return "/" + "/".join(parts)


def parent_of(path: str) -> str:
    return join(parts_of(path)[:-1])


def ancestors(path: str) -> list[str]:
    """``path`` and the directories above it, the root excluded."""
    parts = parts_of(path)
    return [join(parts[: i + 1]) for i in range(len(parts))]


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def move_tree(table: dict[str, V], src: str, dst: str) -> None:
    moved = {p: v for p, v in table.items() if under(p, src)}
    for p in moved:
        del table[p]
    for p, v in moved.items():
        table[dst + p[len(src) :]] = v


class ClientMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="tectonic-sm-")
        Cluster.create(
            self.root,
            nodes=CONFIG.nodes,
            encoding=CONFIG.encoding,
            block_size=CONFIG.block_size,
            sync=CONFIG.sync,
        )
        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self.cluster: Cluster = self.run(self.stack.enter_async_context(Cluster.open(self.root)))
        self.client: Client = self.cluster.client()
        self.files: dict[str, FileModel] = {}
        self.dirs: dict[str, str | None] = {"/": None}
        self.writers: list[WriterModel] = []
        self.stopped: set[int] = set()
        self.changed = False  # since the last repair: files, nodes or writers

    def teardown(self) -> None:
        try:
            for w in self.writers:
                self.run(w.writer.abort())
            self.run(self.stack.aclose())
        finally:
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def call(self, coro: Coroutine[Any, Any, T], expected: type[TectonicError] | None) -> T | None:
        """Run ``coro``; it must raise exactly ``expected`` (or succeed when None)."""
        try:
            result = self.run(coro)
        except TectonicError as e:
            assert expected is not None, f"unexpected {e!r}"
            assert type(e) is expected, f"{e!r}, expected {expected.__name__}"
            return None
        assert expected is None, f"expected {expected.__name__}, got {result!r:.80}"
        return result

    def kind(self, path: str) -> str | None:
        if path in self.dirs:
            return "dir"
        return "file" if path in self.files else None

    def walk_error(self, parts: list[str]) -> type[TectonicError] | None:
        """What resolving the directory ``parts`` raises."""
        for i in range(len(parts)):
            kind = self.kind(join(parts[: i + 1]))
            if kind is None:
                return NotFoundError
            if kind == "file":
                return NotADirectoryError_
        return None

    def lookup_error(self, path: str) -> type[TectonicError] | None:
        """What looking up an existing non-root ``path`` raises."""
        parts = parts_of(path)
        if not parts:
            return InvalidPathError
        err = self.walk_error(parts[:-1])
        if err is None and self.kind(path) is None:
            err = NotFoundError
        return err

    def inherited(self, path: str) -> str:
        parts = parts_of(path)
        enc = DEFAULT_ENCODING
        for i in range(len(parts)):
            enc = self.dirs.get(join(parts[:i]), None) or enc
        return enc

    def children(self, path: str) -> list[str]:
        return sorted(
            parts_of(p)[-1]
            for p in [*self.files, *self.dirs]
            if p != "/" and p != path and parent_of(p) == path
        )

    def drop_file(self, path: str) -> None:
        f = self.files.pop(path)
        f.writer = None  # the file's writer, if any, is fenced

    def drop_tree(self, top: str) -> None:
        for p in [p for p in self.files if under(p, top)]:
            self.drop_file(p)
        for p in [p for p in self.dirs if under(p, top)]:
            del self.dirs[p]

    def draw_path(self, data: st.DataObject, *, root: bool = False) -> str:
        """Mostly a path near the model's tree (an entry, or a new name in a directory)."""
        near = {*self.files, *self.dirs}
        near.update(join([*parts_of(d), n]) for d in self.dirs for n in "abc")
        if not root:
            near.discard("/")
        nearby = st.sampled_from(sorted(near))
        return data.draw(st.one_of(nearby, nearby, nearby, paths), label="path")

    def wrote(self, f: FileModel) -> None:
        """Blocks of ``f`` are being placed now, on the nodes that are up."""
        f.safe_down = min(f.safe_down, safe_down(f.encoding, len(self.stopped)))

    def may_stop(self) -> int:
        return min([MAX_STOPPED, *(f.safe_down for f in self.files.values())])

    def no_writes_in_flight(self) -> bool:
        return not any(w.in_flight for w in self.writers)

    def read_and_check(self, path: str) -> None:
        f = self.files[path]
        f.saw(self.run(self.client.read_file(path)))

    # -- whole files -------------------------------------------------------------------------
    @initialize(data=st.data(), dirs=st.lists(paths, max_size=3), nfiles=st.integers(1, 5))
    def populate(self, data: st.DataObject, dirs: list[str], nfiles: int) -> None:
        """Start from a small tree, so that the rules meet files and directories early."""
        for path in dirs:
            self.run(self.client.mkdir(path, parents=True))
            self.dirs.update(dict.fromkeys(ancestors(path), None))
        for _ in range(nfiles):
            payload = data.draw(payloads, label="payload")
            encoding = data.draw(encodings, label="encoding")
            self.write_file_at(self.draw_path(data), payload, encoding)
        if data.draw(st.booleans(), label="open a writer"):
            self.open_writer_at("/log", data.draw(encodings, label="encoding"))

    @rule(data=st.data(), payload=payloads, encoding=encodings)
    def write_file(self, data: st.DataObject, payload: Payload, encoding: str | None) -> None:
        self.write_file_at(self.draw_path(data), payload, encoding)

    def write_file_at(self, path: str, spec: Payload, encoding: str | None) -> None:
        err = self.walk_error(parts_of(path)[:-1])
        if err is None and self.kind(path) == "dir":
            err = IsADirectoryError_
        enc = encoding or self.inherited(path)  # meaningful when err is None
        payload = spec.make(enc)
        self.call(self.client.write_file(path, payload, encoding=encoding), err)
        if err is None:
            if path in self.files:
                self.drop_file(path)
            self.files[path] = FileModel(enc, payload)
            if payload:
                self.wrote(self.files[path])
            self.changed = True

    @rule(data=st.data())
    def probe(self, data: st.DataObject) -> None:
        """read_file, listdir and exists of any path, errors included."""
        path = self.draw_path(data, root=True)
        kind = self.kind(path)
        err = None if path == "/" else self.lookup_error(path)
        if err is None and kind == "dir":
            err = IsADirectoryError_
        got = self.call(self.client.read_file(path), err)
        if err is None:
            assert got is not None
            self.files[path].saw(got)
        err = None if path == "/" else self.lookup_error(path)
        if err is None and kind == "file":
            err = NotADirectoryError_
        names = self.call(self.client.listdir(path), err)
        if err is None:
            assert names == self.children(path)
        assert self.run(self.client.exists(path)) == (kind is not None)

    @precondition(lambda self: self.files)
    @rule(data=st.data(), into=st.booleans())
    def read_range(self, data: st.DataObject, into: bool) -> None:
        path = data.draw(st.sampled_from(sorted(self.files)), label="path")
        f = self.files[path]
        # Draws must not depend on what was read so far (that varies with timing): scale them.
        total = len(f.durable) + len(f.pending)
        offset = total * data.draw(st.integers(0, 1250), label="offset per mille") // 1000
        if data.draw(st.booleans(), label="near a block edge"):
            edge = offset - offset % f.block
            offset = max(0, edge + data.draw(st.integers(-2, 2), label="delta"))
        size = data.draw(st.integers(0 if into else -1, 3 * f.block), label="size")
        if into:
            buf = bytearray(b"\xee" * size)
            n = self.run(self.client.read_into(path, offset, buf))
            got = bytes(buf[:n])
            assert buf[n:] == b"\xee" * (size - n)  # nothing written past the count
        else:
            got = self.run(self.client.read(path, offset, size))
        stop = None if size < 0 else offset + size
        assert got in [c[offset:stop] for c in f.candidates()]

    # -- namespace ---------------------------------------------------------------------------
    @rule(data=st.data(), parents=st.booleans(), exist_ok=st.booleans(), encoding=encodings)
    def mkdir(
        self, data: st.DataObject, parents: bool, exist_ok: bool, encoding: str | None
    ) -> None:
        path = self.draw_path(data, root=True)
        parts = parts_of(path)
        err: type[TectonicError] | None = None
        if not parts and not (parents or exist_ok):
            err = AlreadyExistsError
        created: list[str] = []
        for i in range(len(parts)):
            sub, last = join(parts[: i + 1]), i == len(parts) - 1
            kind = self.kind(sub)
            if kind == "file":
                err = AlreadyExistsError if last else NotADirectoryError_
            elif kind == "dir":
                if last and not (parents or exist_ok):
                    err = AlreadyExistsError
                continue
            elif not (last or parents):
                err = NotFoundError
            if err is not None:
                break
            created.append(sub)
        self.call(
            self.client.mkdir(path, parents=parents, exist_ok=exist_ok, encoding=encoding), err
        )
        if err is None:
            for sub in created:
                self.dirs[sub] = encoding if sub == path else None

    @rule(data=st.data())
    def rename(self, data: st.DataObject) -> None:
        src = self.draw_path(data, root=True)
        if data.draw(st.booleans(), label="into src"):  # also tries moving a dir into itself
            dst = join([*parts_of(src), data.draw(names, label="name")])
        else:
            dst = self.draw_path(data, root=True)
        err = self.predict_rename(src, dst)
        self.call(self.client.rename(src, dst), err)
        if err is not None or src == dst:
            return
        self.changed = True
        if self.kind(dst) == "file":
            self.drop_file(dst)
        elif self.kind(dst) == "dir":
            del self.dirs[dst]  # empty, as predicted
        if self.kind(src) == "file":
            self.files[dst] = self.files.pop(src)
            return
        move_tree(self.files, src, dst)
        move_tree(self.dirs, src, dst)

    def predict_rename(self, src: str, dst: str) -> type[TectonicError] | None:
        if src == "/" or dst == "/":
            return InvalidPathError
        err = self.lookup_error(src) or self.walk_error(parts_of(dst)[:-1])
        if err is not None:
            return err
        skind, dkind = self.kind(src), self.kind(dst)
        if skind == "dir" and under(parent_of(dst), src):
            return InvalidArgumentError
        if src == dst:
            return None
        if dkind == "dir":
            if skind != "dir":
                return IsADirectoryError_
            if self.children(dst):
                return DirectoryNotEmptyError
        elif dkind == "file" and skind == "dir":
            return NotADirectoryError_
        return None

    @rule(data=st.data(), recursive=st.booleans())
    def delete(self, data: st.DataObject, recursive: bool) -> None:
        path = self.draw_path(data, root=True)
        err = self.lookup_error(path)
        if err is None and self.kind(path) == "dir" and self.children(path) and not recursive:
            err = DirectoryNotEmptyError
        self.call(self.client.delete(path, recursive=recursive), err)
        if err is None:
            self.drop_tree(path)
            self.changed = True

    # -- writers -----------------------------------------------------------------------------
    @precondition(lambda self: len(self.writers) < MAX_WRITERS)
    @rule(data=st.data(), encoding=encodings)
    def open_writer(self, data: st.DataObject, encoding: str | None) -> None:
        fresh = [join([*parts_of(d), n]) for d in sorted(self.dirs) for n in "abc"]
        pool = {
            "new": [p for p in fresh if self.kind(p) is None],
            "take over": sorted(p for p, f in self.files.items() if not f.sealed),
            "any": [],
        }[data.draw(st.sampled_from(["new", "take over", "any", "take over"]), label="which")]
        path = data.draw(st.sampled_from(pool), label="path") if pool else self.draw_path(data)
        self.open_writer_at(path, encoding)

    def open_writer_at(self, path: str, encoding: str | None) -> None:
        err = self.walk_error(parts_of(path)[:-1])
        f = self.files.get(path)
        if err is None and self.kind(path) == "dir":
            err = IsADirectoryError_
        elif err is None and f is not None:
            if f.sealed:
                err = SealedFileError
            elif encoding is not None and encoding != f.encoding:
                err = InvalidArgumentError
        w = self.call(self.client.open_writer(path, encoding=encoding), err)
        if err is not None:
            return
        assert w is not None
        if f is None:
            f = self.files[path] = FileModel(encoding or self.inherited(path), b"", sealed=False)
        wm = WriterModel(w, f)
        f.writer = wm  # a previous writer is fenced now
        f.unflushed = 0
        self.writers.append(wm)
        # The old writer can commit nothing more: what is there now is where we append.
        self.read_and_check(path)
        f.pending = b""
        assert w.offset == len(f.durable)

    def pick_writer(self, data: st.DataObject) -> WriterModel:
        self.changed = True
        return self.writers[data.draw(st.integers(0, len(self.writers) - 1), label="writer")]

    def forget(self, w: WriterModel) -> None:
        """After an error the writer is aborted: it refuses everything from now on."""
        self.writers.remove(w)
        try:
            self.run(w.writer.append(b"x"))
        except WriterClosedError:
            pass
        else:
            raise AssertionError("a writer that failed still accepts appends")

    @precondition(lambda self: self.writers)
    @rule(data=st.data(), pieces=st.lists(appends, min_size=1, max_size=3))
    def append(self, data: st.DataObject, pieces: list[Payload]) -> None:
        w = self.pick_writer(data)
        for piece in pieces:
            chunk = piece.make(w.file.encoding)
            self.call(w.writer.append(chunk), FencedWriterError if w.fenced else None)
            if w.fenced:
                self.forget(w)
                return
            w.file.pending += chunk
            w.file.unflushed += len(chunk)
            if chunk:
                self.wrote(w.file)

    @precondition(lambda self: self.writers)
    @rule(data=st.data())
    def flush(self, data: st.DataObject) -> None:
        w = self.pick_writer(data)
        if w.fenced:
            # Nothing buffered and every block committed before the fence: nothing to refuse.
            with contextlib.suppress(FencedWriterError):
                self.run(w.writer.flush())
            self.run(w.writer.abort())
            self.writers.remove(w)
            return
        self.run(w.writer.flush())
        self.flushed(w.file)

    @precondition(lambda self: self.writers)
    @rule(data=st.data(), length=st.integers(1, 3 * BLOCK))
    def append_hole(self, data: st.DataObject, length: int) -> None:
        """A hole: the bytes appended before it are flushed, then ``length`` zeros are
        committed at once (nothing stored; a fenced writer commits nothing)."""
        w = self.pick_writer(data)
        self.call(w.writer.append_hole(length), FencedWriterError if w.fenced else None)
        if w.fenced:
            self.forget(w)
            return
        self.flushed(w.file)
        w.file.durable += bytes(length)

    def flushed(self, f: FileModel) -> None:
        if f.unflushed:
            self.wrote(f)
        f.durable += f.pending
        f.pending = b""
        f.unflushed = 0

    @precondition(lambda self: self.writers)
    @rule(data=st.data(), abort=st.booleans())
    def close_writer(self, data: st.DataObject, abort: bool) -> None:
        w = self.pick_writer(data)
        if abort:
            self.abort_writer(w)
            return
        self.call(w.writer.close(), FencedWriterError if w.fenced else None)
        if w.fenced:
            self.forget(w)
            return
        self.writers.remove(w)
        f = w.file
        self.flushed(f)
        f.sealed = True
        f.writer = None
        self.call(w.writer.append(b"x"), WriterClosedError)

    def abort_writer(self, w: WriterModel) -> None:
        """A writer that gives up (or a process that dies): the file stays unsealed, with
        its committed prefix, for the next writer to take over."""
        self.run(w.writer.abort())
        self.writers.remove(w)
        if not w.fenced:
            w.file.writer = None
            w.file.unflushed = 0  # blocks in flight were cancelled and waited for

    # -- nodes, repair -----------------------------------------------------------------------
    @precondition(lambda self: len(self.stopped) < self.may_stop() and self.no_writes_in_flight())
    @rule(data=st.data())
    def stop_node(self, data: st.DataObject) -> None:
        """Stop a node, keeping every block readable (blocks still in flight may have chunks
        on any node, hence no stops while a writer has full blocks out)."""
        n = data.draw(st.sampled_from(sorted(set(range(NODES)) - self.stopped)), label="node")
        self.cluster.stop_node(n)
        self.stopped.add(n)
        self.changed = True

    @precondition(lambda self: self.stopped)
    @rule(data=st.data())
    def start_node(self, data: st.DataObject) -> None:
        n = data.draw(st.sampled_from(sorted(self.stopped)), label="node")
        self.cluster.start_node(n)
        self.stopped.discard(n)
        self.changed = True

    @precondition(lambda self: self.changed)
    @rule()
    def repair(self) -> None:
        self.changed = False
        quiet = self.no_writes_in_flight()
        # A zero grace period would collect chunks of blocks still being written.
        report = self.run(repair(self.cluster, gc_grace=0 if quiet else DEFAULT_GC_GRACE))
        assert report.unrecoverable == []
        if quiet and not self.stopped:
            assert report.not_enough_nodes == []
            status = self.run(self.cluster.status())
            assert status.blocks_below_redundancy == 0, status
            assert all(n.up for n in status.nodes)
            sc = self.run(scrub(self.cluster))
            assert sc.clean, sc
            for f in self.files.values():  # every block is on distinct nodes again
                f.safe_down = safe_down(f.encoding, 0)

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def files_read_back(self) -> None:
        for path, f in self.files.items():
            st_ = self.run(self.client.stat(path))
            assert (st_.kind, st_.encoding, st_.sealed) == ("file", f.encoding, f.sealed)
            assert st_.size in [len(c) for c in f.candidates()]
            self.read_and_check(path)

    @invariant()
    def listings_match(self) -> None:
        for path in self.dirs:
            assert self.run(self.client.listdir(path)) == self.children(path), path


ClientMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestClientMachine = ClientMachine.TestCase
