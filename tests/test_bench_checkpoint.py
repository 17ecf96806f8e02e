"""``bench checkpoint`` at a tiny scale: every path runs for real, the JSON matches its schema,
wrong bytes are caught, and the targets are computed from the figures."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from bench import checkpoint as ck
from bench.cli import bench
from clients.ckpt_models import checkpoint_plan

TINY = 0.00005  # llama3-8b: about 5.6 MB in 16 files over 8 ranks

needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or os.geteuid() != 0, reason="mounting needs root and FUSE"
)


@needs_fuse
def test_every_path_at_tiny_scale(tmp_path: Path) -> None:
    res = asyncio.run(
        ck.run_checkpoint_bench(
            model="llama3-8b", directory=tmp_path, scale=TINY, writes=2, reads=1, pause=0.0
        )
    )
    doc = res.to_dict()
    jsonschema.validate(doc, ck.SCHEMA)
    json.dumps(doc)  # plain JSON types only
    plan = checkpoint_plan("llama3-8b", scale=TINY)
    assert doc["total_bytes"] == plan.total and doc["files"] == len(plan.files) == 16
    keys = [p["key"] for p in doc["paths"]]
    assert keys[:7] == [
        "raw",
        "native/r1",
        "native/r3",
        "native/rs-6-3",
        "fuse/r1",
        "fuse/r3",
        "fuse/rs-6-3",
    ]
    for p in doc["paths"]:
        if p["available"]:
            assert len(p["write"]["samples"]) == 2 and len(p["read"]["samples"]) == 1
            assert p["write"]["throughput_gb_s"] > 0 and p["read"]["duration_s"] > 0
            for s in p["write"]["samples"]:  # the slowest rank never beats the whole operation
                assert s["total_gb_s"] <= s["throughput_gb_s"] + 1e-3
        else:
            assert p["reason"]
    names = [t["name"] for t in doc["targets"]]
    assert "fuse/r3 vs native/r3, read" in names and "native/rs-6-3 vs raw / 1.5, write" in names
    assert list(tmp_path.iterdir()) == []  # the bench cleans up after itself


def flip_byte(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(raw)


def test_wrong_bytes_are_caught(tmp_path: Path) -> None:
    plan = checkpoint_plan("llama3-8b", ranks=8, scale=TINY)
    pl = ck.Payload(plan)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        route = ck.FilesRoute(pool, "files", "plain files", tmp_path, 0, 1.0)

        async def go() -> None:
            await route.save(1, pl)
            pl.clear_back()
            await route.load(1, pl, shift=3)
            pl.check_back(route.key)  # whole and right
            victim = tmp_path / "ckpt-1" / plan.per_rank[5].files[1].name
            flip_byte(victim, 1000)
            pl.clear_back()
            await route.load(1, pl, shift=3)
            with pytest.raises(ck.BenchError, match="differ"):
                pl.check_back(route.key)
            victim.write_bytes(b"short")
            with pytest.raises(OSError, match="expected"):
                await route.load(1, pl, shift=0)

        asyncio.run(go())


def _figures(gb_s: float) -> ck.Figures:
    return ck.Figures.mean([ck.Sample(1.0, gb_s, gb_s)])


def test_targets_follow_the_figures() -> None:
    def path(
        key: str, w: float, r: float, tolerates: int = 0, overhead: float = 1.0, title: str = ""
    ) -> ck.PathResult:
        return ck.PathResult(
            key, title or key, tolerates, overhead, True, None, _figures(w), _figures(r)
        )

    paths = [
        path("raw", 1.2, 0.9),
        path("native/r1", 0.6, 0.8),
        path("native/r3", 0.3, 0.8, 2, 3.0),
        path("fuse/r1", 0.5, 0.5),
        path("fuse/r3", 0.25, 0.6, 2, 3.0),
        path("dcp/local", 1.0, 0.8),
        path("dcp/plugin", 0.55, 0.8, title="DCP through TectonicStorageWriter, r1"),
        path("peer/juicefs", 0.2, 0.45),
        path("peer/seaweedfs", 0.4, 0.3),
        path("peer/glusterfs-r3", 0.1, 0.2, 2, 3.0),
    ]
    res = ck.CheckpointBench(
        ck.SCHEMA_ID, "llama3-8b", 8, 0.01, {}, 1, 1, 1, 1, 1, 1, 1, 0.0, 1, 1, 8, True, paths, []
    )
    got = {t.name: (t.value, t.met) for t in ck.targets(res)}
    assert got["native/r1 vs dcp/local, write"] == (0.6, False)
    assert got["native/r1 vs dcp/local, read"] == (1.0, True)
    assert got["native/r1 vs dcp/local, write (issue 22)"] == (0.6, False)
    assert got["native/r1 vs dcp/local, read (issue 22)"] == (1.0, True)
    assert got["native/r3 vs raw / 3, write"] == (0.75, True)  # 0.3 / (1.2 / 3)
    assert got["fuse/r1 vs native/r1, read"] == (0.625, False)
    assert got["dcp/plugin vs native/r1, write"] == (0.917, True)
    # the best single-copy peer is chosen per direction: seaweedfs writes, juicefs reads
    assert got["fuse/r1 vs best peer (peer/seaweedfs), write"] == (1.25, False)
    assert got["fuse/r1 vs best peer (peer/juicefs), read"] == (1.111, True)
    assert got["fuse/r3 vs best peer (peer/glusterfs-r3), write"] == (2.5, True)


@needs_fuse
def test_command_line_json_and_plots(tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    work = tmp_path / "work"
    work.mkdir()
    out = CliRunner().invoke(
        bench,
        [
            "checkpoint",
            "--scale",
            str(TINY),
            "--paths",
            "raw,native,fuse",
            "--encodings",
            "r1",
            "--writes",
            "1",
            "--pause",
            "0",
            "--dir",
            str(work),
            "--json",
            "--plot",
            str(plots),
        ],
        catch_exceptions=False,
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, ck.SCHEMA)
    assert [p["key"] for p in doc["paths"]] == ["raw", "native/r1", "fuse/r1"]
    pngs = sorted(plots.glob("*.png"))
    assert [p.name for p in pngs] == [
        "checkpoint-llama3-8b-throughput.png",
        "checkpoint-llama3-8b-vs-raw.png",
    ]
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ck.BenchError, match="unknown paths"):
        asyncio.run(
            ck.run_checkpoint_bench(
                model="llama3-8b", directory=tmp_path, scale=TINY, paths=("raw", "nfs")
            )
        )
    out = CliRunner().invoke(bench, ["checkpoint", "--model", "gpt-9", "--dir", str(tmp_path)])
    assert out.exit_code == 2 and "gpt-9" in out.output


@needs_fuse
def test_peers_are_measured_at_the_same_redundancy(tmp_path: Path) -> None:
    from bench import peers

    names = [n for n in ("juicefs", "glusterfs-r3") if peers.missing(n) is None]
    if not names:
        pytest.skip("no peer installed (pip install -e '.[peers]'; apt glusterfs-server)")
    res = asyncio.run(
        ck.run_checkpoint_bench(
            model="llama3-8b",
            directory=tmp_path,
            scale=TINY,
            encodings=("r1", "r3"),
            paths=("fuse",),
            peers=names,
            writes=1,
            pause=0.0,
        )
    )
    jsonschema.validate(res.to_dict(), ck.SCHEMA)
    for name in names:
        p = res.path(f"peer/{name}")
        assert p is not None and p.write and p.read and p.read.throughput_gb_s > 0
        assert p.tolerates == peers.PEERS[name].copies - 1
    got = {t.name.split(" (")[0] for t in res.targets}
    if "juicefs" in names:
        assert "fuse/r1 vs best peer" in got
    if "glusterfs-r3" in names:
        assert "fuse/r3 vs best peer" in got
    assert list(tmp_path.iterdir()) == []
    mounts = Path("/proc/mounts").read_text()
    assert "juicefs" not in mounts and "glusterfs" not in mounts


def test_our_client_across_namespaced_hosts(tmp_path: Path) -> None:
    """``--hosts 2``: the native client against a cluster of two network-namespace hosts over
    paced links, every byte read back checked, or the reason it cannot run here."""
    from bench import netns, postgres

    res = asyncio.run(
        ck.run_checkpoint_bench(
            model="llama3-8b", directory=tmp_path, scale=TINY, encodings=["r1", "r3"],
            paths=["native"], writes=1, pause=0.0, hosts=2, hosts_nic_gbps=2, hosts_rtt_ms=2,
        )
    )  # fmt: skip
    doc = res.to_dict()
    jsonschema.validate(doc, ck.SCHEMA)
    across = {p["key"]: p for p in doc["paths"] if p["key"].startswith("hosts/")}
    assert set(across) == {"hosts/r1", "hosts/r3"}
    why = netns.unavailable() or (None if postgres.bin_dir() else "no PostgreSQL")
    for p in across.values():
        if why is None:
            assert p["available"], p["reason"]
            assert "across 2 namespaced hosts x 2 nodes, 2 Gb/s, 2 ms" in p["title"]
            assert p["write"]["throughput_gb_s"] > 0 and p["read"]["throughput_gb_s"] > 0
        else:
            assert not p["available"] and p["reason"] == why
    assert list(tmp_path.iterdir()) == []
