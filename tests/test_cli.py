"""The ``tectonic-emu`` command, run for real as a subprocess (``python -m tectonic_emu``).

Error cases always go through a real process, so that "one line on stderr, no traceback" is
what a user sees. Cheap happy paths (namespace commands, ``--help``) use click's CliRunner.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from tectonic_emu import Cluster, ClusterConfig, Encoding
from tectonic_emu.cli import cli
from tectonic_emu.cli.listing import long_listing

from .conftest import SMALL_BLOCK, make_cluster, run_with

ENV_VAR = "TECTONIC_EMU_CLUSTER"


# -- running the command ---------------------------------------------------------------------
def tecto(
    *args: str, cluster: Path | None = None, cwd: Path | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """Run ``tectonic-emu ARGS`` with $TECTONIC_EMU_CLUSTER set to ``cluster`` (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if cluster is not None:
        env[ENV_VAR] = str(cluster)
    return subprocess.run(
        [sys.executable, "-m", "tectonic_emu", *args],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


def ok(
    *args: str, cluster: Path | None = None, cwd: Path | None = None, stdin: bytes = b""
) -> bytes:
    r = tecto(*args, cluster=cluster, cwd=cwd, stdin=stdin)
    assert r.returncode == 0, (args, r.returncode, r.stderr.decode())
    return r.stdout


def ok_json(*args: str, cluster: Path | None = None) -> Any:
    return json.loads(ok(*args, "--json", cluster=cluster))


def fails(*args: str, cluster: Path | None = None, cwd: Path | None = None, mentions: str) -> str:
    """Run a command that must fail with exactly one clear line on stderr; return the line."""
    r = tecto(*args, cluster=cluster, cwd=cwd)
    err = r.stderr.decode()
    assert r.returncode != 0, (args, r.stdout.decode())
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"want one line on stderr, got {err!r}"
    assert "error" in lines[0], lines[0]
    assert mentions in lines[0], (mentions, lines[0])
    assert r.stdout == b"", r.stdout
    return lines[0]


# -- what is stored --------------------------------------------------------------------------
def snapshot(root: Path) -> tuple[dict[str, Any], list[str]]:
    """Every path with its stat and contents, and every file under the nodes' directories."""

    async def go(c: Cluster) -> dict[str, Any]:
        client = c.client()
        tree: dict[str, Any] = {}

        async def walk(path: str) -> None:
            for e in await client.scandir(path):
                p = path.rstrip("/") + "/" + e.name
                st = await client.stat(p)
                if st.kind == "dir":
                    tree[p] = ("dir", st.encoding, st.ctime)
                    await walk(p)
                else:
                    data = await client.read_file(p)
                    tree[p] = ("file", st.size, st.encoding, st.sealed, st.mtime, data)

        await walk("/")
        return tree

    files = sorted(str(p.relative_to(root)) for p in (root / "nodes").rglob("*") if p.is_file())
    return run_with(root, go), files


def block_of(cluster: Path, encoding: str) -> int:
    """Bytes per block of an ``encoding`` file in ``cluster`` (RS blocks hold D chunks)."""
    return ClusterConfig.load(cluster).block_size_for(Encoding.parse(encoding))


def local_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def chunks_of(stat: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for b in stat["block_list"]:
        yield from b["chunks"]


# -- cluster, nodes, no cluster --------------------------------------------------------------
def test_cluster_create_status_and_node_stop_start(tmp_path: Path) -> None:
    root = tmp_path / "c"
    # --cluster given explicitly, no environment variable
    create = "cluster create --nodes 5 --disks-per-node 3 --encoding r3 --block-size 64KiB"
    cfg = ok_json(*create.split(), "--cluster", str(root))
    got = (cfg["nodes"], cfg["disks_per_node"], cfg["encoding"], cfg["block_size"])
    assert got == (5, 3, "r3", SMALL_BLOCK)
    assert sorted(p.name for p in (root / "nodes").iterdir()) == [f"n{n:03d}" for n in range(5)]
    assert all(
        sorted(p.name for p in (root / "nodes" / f"n{n:03d}").iterdir()) == ["d0", "d1", "d2"]
        for n in range(5)
    )

    data = os.urandom(3 * SMALL_BLOCK + 100)
    (tmp_path / "data.bin").write_bytes(data)
    ok("put", str(tmp_path / "data.bin"), "/data", cluster=root)

    # --cluster wins over a wrong $TECTONIC_EMU_CLUSTER
    st = ok_json("cluster", "status", "--cluster", str(root), cluster=tmp_path / "elsewhere")
    assert [(n["node"], n["up"]) for n in st["nodes"]] == [(n, True) for n in range(5)]
    assert (st["files"], st["blocks"], st["logical_bytes"]) == (1, 4, len(data))
    assert st["physical_bytes"] == 3 * len(data)  # random bytes: stored uncompressed
    assert sum(n["bytes_used"] for n in st["nodes"]) >= st["physical_bytes"]
    assert sum(n["chunks"] for n in st["nodes"]) == 3 * 4
    assert st["blocks_below_redundancy"] == 0

    layout = ok_json("stat", "/data", cluster=root)
    on_node_2 = sum(any(c["node"] == 2 for c in b["chunks"]) for b in layout["block_list"])

    ok("node", "stop", "2", cluster=root)
    st = ok_json("cluster", "status", cluster=root)  # a new process sees node 2 down
    assert [n["up"] for n in st["nodes"]] == [True, True, False, True, True]
    assert st["blocks_below_redundancy"] == on_node_2
    assert ok("get", "/data", "-", cluster=root) == data  # r3 reads around the stopped node

    ok("node", "start", "2", cluster=root)
    st = ok_json("cluster", "status", cluster=root)
    assert all(n["up"] for n in st["nodes"]) and st["blocks_below_redundancy"] == 0

    config_before = (root / "cluster.json").read_bytes()
    fails("node", "stop", "7", cluster=root, mentions="no node 7")
    fails("cluster", "create", "--nodes", "9", cluster=root, mentions=str(root))
    assert (root / "cluster.json").read_bytes() == config_before

    other = tmp_path / "other"
    fails("cluster", "create", "--encoding", "x9", cluster=other, mentions="x9")
    fails("cluster", "create", "--block-size", "banana", cluster=other, mentions="banana")
    assert not other.exists()

    # no cluster at --cluster: a missing directory, and one with no cluster.json
    fails("ls", "--cluster", str(tmp_path / "nowhere"), mentions=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    fails("cluster", "status", cluster=tmp_path / "empty", mentions=str(tmp_path / "empty"))
    # neither --cluster nor the variable: click's usage error, still no traceback
    r = tecto("ls")
    assert r.returncode == 2 and "Traceback" not in r.stderr.decode()
    assert "--cluster" in r.stderr.decode()


# -- files -----------------------------------------------------------------------------------
@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """A 9-node rs-6-3 cluster with 64 KiB blocks, made in process (cheaper than the CLI)."""
    return make_cluster(tmp_path / "c", nodes=9)


@pytest.mark.parametrize(("encoding", "width"), [("r1", 1), ("r3", 3), ("rs-6-3", 9)])
def test_put_get_round_trip(tmp_path: Path, cluster: Path, encoding: str, width: int) -> None:
    bs = block_of(cluster, encoding)
    data = os.urandom(3 * bs + 12345)  # four blocks, the last one short
    (tmp_path / "in.bin").write_bytes(data)
    ok("put", "--encoding", encoding, "in.bin", "/f", cluster=cluster, cwd=tmp_path)
    ok("get", "/f", "out.bin", cluster=cluster, cwd=tmp_path)
    assert (tmp_path / "out.bin").read_bytes() == data
    assert not (tmp_path / "out.bin.part").exists()

    st = ok_json("stat", "/f", cluster=cluster)
    got = tuple(st[k] for k in ("path", "kind", "size", "encoding", "sealed", "blocks"))
    assert got == ("/f", "file", len(data), encoding, True, 4)
    assert [(b["block_no"], b["offset"]) for b in st["block_list"]] == [
        (i, i * bs) for i in range(4)
    ]
    assert sum(b["length"] for b in st["block_list"]) == len(data)
    for b in st["block_list"]:
        assert len(b["chunks"]) == width
        assert len({c["node"] for c in b["chunks"]}) == width  # distinct nodes
        for c in b["chunks"]:
            disk_dir = cluster / "nodes" / f"n{c['node']:03d}" / f"d{c['disk']}"
            assert Path(c["path"]).is_file(), c
            assert Path(c["path"]).is_relative_to(disk_dir), c
            assert c["chunk_id"] in c["path"]


def test_stdin_stdout_and_listing(tmp_path: Path, cluster: Path) -> None:
    data = os.urandom(2 * block_of(cluster, "rs-6-3") + 7)  # three blocks
    ok("put", "-", "/from-stdin", cluster=cluster, stdin=data)
    assert ok("get", "/from-stdin", "-", cluster=cluster) == data
    ok("put", "--encoding", "r3", "-", "/empty", cluster=cluster, stdin=b"")
    assert ok("get", "/empty", "-", cluster=cluster) == b""

    rows = ok_json("ls", "/", cluster=cluster)
    assert [(r["path"], r["kind"], r["size"], r["encoding"], r["sealed"]) for r in rows] == [
        ("/empty", "file", 0, "r3", True),
        ("/from-stdin", "file", len(data), "rs-6-3", True),  # no leftover temporary file
    ]
    long = ok("ls", "-l", cluster=cluster).decode().splitlines()
    assert len(long) == 2
    size = str(len(data))
    assert long[1].split()[:7] == ["-rw-r--r--", "1", "0", "0", size, "rs-6-3", "s"]
    assert long[1].split()[-1] == "from-stdin"


def test_namespace_commands(tmp_path: Path, cluster: Path) -> None:
    runner = CliRunner()
    env = {ENV_VAR: str(cluster)}

    def run(*args: str) -> str:
        r = runner.invoke(cli, list(args), env=env, catch_exceptions=False)
        assert r.exit_code == 0, (args, r.output)
        return r.stdout

    (tmp_path / "x.bin").write_bytes(b"x" * 1000)
    run("mkdir", "-p", "/a/b/c")
    run("mkdir", "-p", "/a/b/c")  # -p: no error when it exists
    run("mkdir", "--encoding", "r3", "/a/r3")
    run("put", str(tmp_path / "x.bin"), "/a/r3/f")
    assert json.loads(run("stat", "--json", "/a/r3/f"))["encoding"] == "r3"  # inherited
    assert json.loads(run("stat", "--json", "/a/r3"))["encoding"] == "r3"
    run("mv", "/a/r3/f", "/a/b/g")
    assert run("ls", "/a/b") == "c/\ng\n"
    assert run("ls", "/a/r3") == ""
    g = run("ls", "-l", "/a/b").splitlines()[1].split()
    assert g[:7] + g[9:] == ["-rw-r--r--", "1", "0", "0", "1000", "r3", "s", "g"]
    assert [r["path"] for r in json.loads(run("ls", "--json", "/a/b/g"))] == ["/a/b/g"]
    run("put", str(tmp_path / "x.bin"), "/a/b/h")
    run("mv", "/a/b/h", "/a/b/g")  # replaces a file
    run("rm", "/a/b/g")
    run("rm", "/a/b/c")  # an empty directory needs no -r
    assert run("ls", "/a/b") == ""
    run("rm", "-r", "/a")
    assert run("ls") == ""
    assert run("stat", "/").split("\n")[:2] == ["path      /", "kind      dir"]
    # the human-readable forms of the service commands
    assert "below redundancy 0" in run("cluster", "status")
    assert "0 corrupt, 0 missing" in run("scrub")
    assert "0 unrecoverable" in run("repair", "--gc-grace", "0")


def test_ls_l_and_stat_show_links_modes_owners_and_times(cluster: Path) -> None:
    """What the native client keeps (issue 21) reaches ls -l, the JSON of ls and stat, and
    stat's lines: a chmod'ed, chown'ed and utime'd file, its hard link, a symlink (never
    followed), a fifo, a block device, a directory."""
    when = 1_700_000_000.0

    async def make(c: Cluster) -> None:
        cl = c.client()
        await cl.mkdir("/d", encoding="r3")
        await cl.write_file("/d/model.bin", b"x" * 1000)
        await cl.chmod("/d/model.bin", 0o4750)
        await cl.chown("/d/model.bin", 65534, 65533)
        await cl.utime("/d/model.bin", atime=when - 60, mtime=when)
        await cl.link("/d/model.bin", "/d/hard-link-of-it")
        await cl.symlink("model.bin", "/d/latest")
        await cl.mknod("/d/fifo", "fifo")
        await cl.mknod("/d/sda1", "blockdev", rdev=os.makedev(8, 1))
        await cl.mkdir("/d/sub")

    run_with(cluster, make)
    runner = CliRunner()

    def run(*args: str) -> str:
        r = runner.invoke(cli, list(args), env={ENV_VAR: str(cluster)}, catch_exceptions=False)
        assert r.exit_code == 0, (args, r.output)
        return r.stdout

    lines = run("ls", "-l", "/d").splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    # Columns line up: every mtime starts at the same place.
    starts = [re.search(r" \d{4}-\d\d-\d\d \d\d:\d\d ", line) for line in lines]
    assert None not in starts and len({m.start() for m in starts if m}) == 1, lines
    rows = {" ".join(f[9:]): f[:9] for f in (line.split() for line in lines)}
    then = time.strftime("%Y-%m-%d %H:%M", time.localtime(when)).split()
    model = ["-rwsr-x---", "2", "65534", "65533", "1000", "r3", "s", *then]
    assert {name: f[:7] for name, f in rows.items()} == {
        "fifo": ["prw-r--r--", "1", "0", "0", "0", "-", "-"],
        "hard-link-of-it": model[:7],
        "latest -> model.bin": ["lrwxrwxrwx", "1", "0", "0", "9", "-", "-"],
        "model.bin": model[:7],
        "sda1": ["brw-r--r--", "1", "0", "0", "8,1", "-", "-"],
        "sub/": ["drwxr-xr-x", "2", "0", "0", "0", "-", "-"],
    }
    assert rows["model.bin"] == rows["hard-link-of-it"] == model

    js = {r["path"]: r for r in json.loads(run("ls", "--json", "/d"))}
    m = js["/d/model.bin"]
    assert (m["mode"], m["mode_str"], m["uid"], m["gid"], m["nlink"]) == (
        0o4750, "-rwsr-x---", 65534, 65533, 2
    )  # fmt: skip
    assert (m["mtime"], m["atime"], m["target"], m["rdev"]) == (when, when - 60, None, 0)
    assert m["ctime"] > when  # chmod, chown, utime and link each moved it
    assert js["/d/hard-link-of-it"] == m | {"path": "/d/hard-link-of-it"}  # one file
    link = js["/d/latest"]
    assert (link["kind"], link["target"], link["size"], link["mode"], link["mode_str"]) == (
        "symlink", "model.bin", 9, 0o777, "lrwxrwxrwx"
    )  # fmt: skip
    assert (js["/d/fifo"]["kind"], js["/d/fifo"]["mode_str"]) == ("fifo", "prw-r--r--")
    assert js["/d/sda1"]["rdev"] == os.makedev(8, 1)
    assert (js["/d/sub"]["nlink"], js["/d/sub"]["mode"]) == (2, 0o755)

    # A symlink lists and stats as itself: not followed, no blocks to look up.
    assert json.loads(run("ls", "--json", "/d/latest")) == [link]
    assert json.loads(run("stat", "--json", "/d/latest")) == link
    st = json.loads(run("stat", "--json", "/d/model.bin"))
    assert len(st.pop("block_list")) == 1 and st == m
    text = run("stat", "/d/latest").splitlines()
    assert "mode      lrwxrwxrwx (0777)" in text and "target    model.bin" in text
    assert "rdev      8,1" in run("stat", "/d/sda1").splitlines()
    text = run("stat", "/d/model.bin").splitlines()
    assert "mode      -rwsr-x--- (4750)" in text and "uid       65534" in text
    assert "mtime     " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) in text


def test_ls_l_fits_80_columns_at_its_widest_cells() -> None:
    """The widths ls -l promises within 80 columns (``long_listing``'s docstring)."""
    row = {
        "path": "/d/" + "n" * 15,
        "kind": "file",
        "size": 99_999_999_999,
        "encoding": "rs-10-4",
        "sealed": False,
        "mode_str": "-rwsr-sr-t",
        "nlink": 99,
        "uid": 99999,
        "gid": 99999,
        "mtime": 4_000_000_000.0,
        "target": None,
    }
    (line,) = long_listing([row])
    assert len(line) == 80, line


def test_long_valid_name(tmp_path: Path, cluster: Path) -> None:
    name = "/" + "n" * 255  # the longest valid name: put's temporary file must not exceed it
    ok("put", "-", name, cluster=cluster, stdin=b"payload")
    assert ok("get", name, "-", cluster=cluster) == b"payload"


# -- faults through the command line ---------------------------------------------------------
def flip_last_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_and_missing_chunks_scrub_and_repair(tmp_path: Path, cluster: Path) -> None:
    data_rs = os.urandom(2 * block_of(cluster, "rs-6-3") + 999)  # three blocks each
    data_r3 = os.urandom(2 * block_of(cluster, "r3") + 555)
    (tmp_path / "rs.bin").write_bytes(data_rs)
    (tmp_path / "r3.bin").write_bytes(data_r3)
    ok("put", "--encoding", "rs-6-3", str(tmp_path / "rs.bin"), "/rs", cluster=cluster)
    ok("put", "--encoding", "r3", str(tmp_path / "r3.bin"), "/r3", cluster=cluster)
    r = tecto("scrub", "--json", cluster=cluster)
    assert r.returncode == 0 and json.loads(r.stdout)["clean"], r.stdout

    # a data chunk (index 0) of the rs file gets a flipped byte; an r3 replica disappears
    corrupt = ok_json("stat", "/rs", cluster=cluster)["block_list"][1]["chunks"][0]
    missing = ok_json("stat", "/r3", cluster=cluster)["block_list"][0]["chunks"][0]
    flip_last_byte(corrupt["path"])
    os.unlink(missing["path"])

    assert ok("get", "/rs", "-", cluster=cluster) == data_rs  # rebuilt from the parity
    assert ok("get", "/r3", "-", cluster=cluster) == data_r3  # read from another replica

    r = tecto("scrub", "--json", cluster=cluster)
    assert r.returncode == 3, (r.returncode, r.stderr.decode())
    report = json.loads(r.stdout)
    key = ("path", "chunk_id", "node", "disk", "index")
    assert [tuple(p[k] for k in key) for p in report["corrupt"]] == [tuple(corrupt[k] for k in key)]
    assert [tuple(p[k] for k in key) for p in report["missing"]] == [tuple(missing[k] for k in key)]
    assert report["unavailable"] == [] and not report["clean"]
    assert ok_json("cluster", "status", cluster=cluster)["blocks_below_redundancy"] >= 1

    fixed = ok_json("repair", "--gc-grace", "0", cluster=cluster)
    assert (fixed["blocks_repaired"], fixed["chunks_rebuilt"]) == (2, 2), fixed
    assert fixed["unrecoverable"] == [] and fixed["not_enough_nodes"] == []

    r = tecto("scrub", "--json", cluster=cluster)
    assert r.returncode == 0, r.stdout.decode()
    assert json.loads(r.stdout)["clean"]
    assert ok_json("cluster", "status", cluster=cluster)["blocks_below_redundancy"] == 0
    assert ok("get", "/rs", "-", cluster=cluster) == data_rs
    for path in ("/rs", "/r3"):
        assert all(
            Path(c["path"]).is_file() for c in chunks_of(ok_json("stat", path, cluster=cluster))
        )


def test_too_few_live_nodes_for_the_encoding(tmp_path: Path, cluster: Path) -> None:
    old = os.urandom(SMALL_BLOCK + 1)
    (tmp_path / "new.bin").write_bytes(os.urandom(SMALL_BLOCK + 2))
    ok("put", "-", "/f", cluster=cluster, stdin=old)
    for n in ("0", "1", "2"):  # rs-6-3 writes need 7 live nodes; 6 are left
        ok("node", "stop", n, cluster=cluster)
    before = snapshot(cluster)
    line = fails("put", str(tmp_path / "new.bin"), "/f", cluster=cluster, mentions="rs-6-3")
    assert "live" in line
    # an encoding wider than the whole cluster
    fails("put", "--encoding", "rs-10-4", "-", "/g", cluster=cluster, mentions="rs-10-4")
    assert snapshot(cluster) == before
    assert before[0]["/f"][-1] == old


# -- errors: one line, non-zero exit, nothing changed ----------------------------------------
ERROR_CASES: list[tuple[str, list[str], str]] = [
    ("get-missing", ["get", "/nope", "out.bin"], "/nope"),
    ("rm-missing", ["rm", "/nope"], "/nope"),
    ("rm-r-missing", ["rm", "-r", "/d/nope"], "/d/nope"),
    ("mv-missing", ["mv", "/nope", "/x"], "/nope"),
    ("mv-to-missing-dir", ["mv", "/f", "/nope/x"], "/nope"),
    ("stat-missing", ["stat", "--json", "/nope"], "/nope"),
    ("ls-missing", ["ls", "/nope"], "/nope"),
    ("put-dotdot", ["put", "local.bin", "/a/../b"], "/a/../b"),
    ("mkdir-dotdot", ["mkdir", "-p", "/a/../b"], "/a/../b"),
    ("mv-dotdot", ["mv", "/f", "/d/../g"], "/d/../g"),
    ("put-long-name", ["put", "local.bin", "/" + "n" * 300], "n" * 100),
    ("mkdir-long-name", ["mkdir", "/d/" + "n" * 300], "n" * 100),
    ("put-over-dir", ["put", "local.bin", "/d"], "/d"),
    ("put-stdin-over-dir", ["put", "-", "/d"], "/d"),
    ("put-below-file", ["put", "local.bin", "/f/x"], "/f"),
    ("mkdir-over-file", ["mkdir", "/f"], "/f"),
    ("mkdir-p-over-file", ["mkdir", "-p", "/f"], "/f"),
    ("mkdir-over-dir", ["mkdir", "/d"], "/d"),
    ("put-unknown-encoding", ["put", "--encoding", "rs-7", "local.bin", "/f"], "rs-7"),
    ("put-unknown-encoding-new", ["put", "--encoding", "rs-7", "local.bin", "/new"], "rs-7"),
    ("mkdir-unknown-encoding", ["mkdir", "--encoding", "bogus", "/new"], "bogus"),
    ("put-encoding-too-wide", ["put", "--encoding", "rs-10-4", "local.bin", "/f"], "rs-10-4"),
    ("rm-non-empty-dir", ["rm", "/d"], "/d"),
    ("get-dir", ["get", "/d", "out.bin"], "/d"),
    ("mv-dir-into-itself", ["mv", "/d", "/d/inside"], "/d"),
    ("rm-root", ["rm", "-r", "/"], "root"),
    ("put-missing-local", ["put", "no-such-local.bin", "/g"], "no-such-local.bin"),
    ("get-into-missing-local-dir", ["get", "/f", "no-such-dir/out.bin"], "no-such-dir"),
]


@pytest.mark.parametrize(
    ("args", "mentions"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_error_is_one_line_and_changes_nothing(
    tmp_path: Path, cluster: Path, args: list[str], mentions: str
) -> None:
    async def fill(c: Cluster) -> None:
        client = c.client()
        await client.mkdir("/d", encoding="r3")
        await client.write_file("/d/x", b"x" * 100)
        await client.write_file("/f", os.urandom(SMALL_BLOCK + 3))

    run_with(cluster, fill)
    work = tmp_path / "work"
    work.mkdir()
    (work / "local.bin").write_bytes(os.urandom(1000))
    before, local_before = snapshot(cluster), local_files(work)
    fails(*args, cluster=cluster, cwd=work, mentions=mentions)
    assert snapshot(cluster) == before
    assert local_files(work) == local_before  # no out.bin, no out.bin.part


# -- help ------------------------------------------------------------------------------------
def command_paths(cmd: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from command_paths(sub, (*path, name))


def test_every_command_has_help_with_an_example() -> None:
    paths = list(command_paths(cli))
    names = {" ".join(p) for p in paths}
    expected = {"", "put", "get", "ls", "mkdir", "mv", "rm", "stat", "scrub", "repair", "demo"}
    expected |= {"cluster", "cluster create", "cluster status", "node", "node stop", "node start"}
    expected |= {"bench"}  # registered through the tectonic_emu.commands entry point
    assert expected <= names, expected - names
    runner = CliRunner()
    for p in paths:
        r = runner.invoke(cli, [*p, "--help"], catch_exceptions=False)
        assert r.exit_code == 0, (p, r.output)
        assert "Usage:" in r.output and "Example" in r.output, (p, r.output)
    r = runner.invoke(cli, ["--version"])
    assert r.exit_code == 0 and "version" in r.output
