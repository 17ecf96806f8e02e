"""``bench all --quick``: every bench runs at a tiny size in one go, and the report, the JSON
(checked against each bench's schema) and the plots come out of it."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from rich.table import Table

from bench.cli import bench
from bench.report import NAMES, markdown


@pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or os.geteuid() != 0, reason="the mount needs root and FUSE"
)
def test_bench_all_quick_writes_the_report_json_and_plots(tmp_path: Path) -> None:
    report = tmp_path / "docs" / "benchmarks.md"
    work = tmp_path / "work"
    work.mkdir()
    out = CliRunner().invoke(
        bench,
        ["all", "--quick", "--report", str(report), "--dir", str(work), "--peers", ""],
        catch_exceptions=False,
    )
    assert out.exit_code == 0, out.output
    text = report.read_text()
    assets = report.parent / "bench"
    for name in NAMES:
        doc = json.loads((assets / f"{name}.json").read_text())
        jsonschema.validate(doc, importlib.import_module(f"bench.{name}").SCHEMA)
        assert f"## {name}\n" in text and f"JSON: `bench/{name}.json`" in text
    pngs = sorted(assets.glob("*.png"))
    assert len(pngs) >= len(NAMES)
    for png in pngs:
        assert png.read_bytes()[:4] == b"\x89PNG" and f"(bench/{png.name})" in text
    assert "## Machine and versions" in text and "| sqlite |" in text
    assert "## Targets" in text and "native/r1 vs dcp/local, write" in text
    assert "save at 4096 ranks vs 16 ranks" in text  # listed, not measured at --quick sizes
    assert list(work.iterdir()) == []


def test_unknown_bench_is_refused(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        bench, ["all", "--only", "store,nfs", "--report", str(tmp_path / "r.md")]
    )
    assert out.exit_code == 2 and "nfs" in out.output
    assert not (tmp_path / "r.md").exists()


def test_markdown_of_a_rich_table() -> None:
    t = Table(title="bench x: [b]title[/b]", caption="a | caption")
    t.add_column("path")
    t.add_column("MB/s")
    t.add_row("raw", "[green]100[/green]")
    t.add_row("a|b", "2")
    assert markdown(t) == (
        "**bench x: title**\n\n| path | MB/s |\n|---|---|\n| raw | 100 |\n| a\\|b | 2 |"
        "\n\na \\| caption"
    )


def test_bench_all_measures_metadata_through_the_mount_and_juicefs_where_they_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 22 compares the mount's metadata rates with JuiceFS's: bench all adds both to
    the default backends where FUSE works, JuiceFS as ``--peers`` says, and the floors under
    the mount (bench/fuse_floor.py) where they can run."""
    from bench import fuse_floor, random_reads, report
    from bench.metadata_backends import default_backends

    monkeypatch.setattr(random_reads, "fuse_missing", lambda: None)
    monkeypatch.setattr(fuse_floor, "why_not", lambda kind: None)
    floors = ("fuse-floor", "fuse-raw-floor")
    assert report._metadata_backends(["juicefs"]) == (
        *default_backends(),
        "mount",
        "juicefs",
        *floors,
    )
    assert report._metadata_backends([]) == (*default_backends(), "mount", *floors)
    monkeypatch.setattr(fuse_floor, "why_not", lambda kind: "root only" if kind == "raw" else None)
    assert report._metadata_backends([]) == (*default_backends(), "mount", "fuse-floor")
    monkeypatch.setattr(random_reads, "fuse_missing", lambda: "no /dev/fuse")
    assert report._metadata_backends(["juicefs"]) == default_backends()
