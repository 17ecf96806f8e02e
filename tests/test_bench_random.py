"""``bench random --quick``: every path runs (the mount where FUSE is, JuiceFS where it is
installed), the JSON validates against the committed schema, and its figures are sane. No
timed assertion: the machine is shared and its rates swing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from bench import peers, random_reads
from bench.cli import bench
from bench.random_reads import check_arguments, offsets
from tectonic_emu.errors import InvalidArgumentError

DOCS = Path(__file__).resolve().parent.parent / "docs"
HAS_FUSE = os.path.exists("/dev/fuse") and os.geteuid() == 0 and random_reads.fuse_missing() is None
HAS_JUICEFS = peers.missing("juicefs") is None


def test_quick_run_gives_valid_sane_json(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        bench, ["random", "--quick", "--json", "--dir", str(tmp_path)], catch_exceptions=False
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    committed = json.loads((DOCS / "schemas" / "bench-random_reads.schema.json").read_text())
    assert committed == json.loads(json.dumps(random_reads.SCHEMA)), "schema changed"
    jsonschema.validate(doc, committed)

    expected = ["local-direct", "local-cold", "local-cached", "native"]
    expected += ["mount"] if HAS_FUSE else []
    expected += ["juicefs"] if HAS_JUICEFS else []
    assert doc["paths"] == expected, doc["skipped"]
    assert set(doc["skipped"]) == {"mount", "juicefs"} - set(expected)
    assert doc["request_sizes"] == [4096, 131072] and doc["rounds"] == 1
    assert len(doc["figures"]) == len(expected) * 2
    for f in doc["figures"]:
        assert len(f["ops_s"]) == 1 and f["ops_s_min"] == f["ops_s_median"] > 0, f
        amp = f["amplification_median"]
        if f["path"].startswith("local-"):  # rchar grows by what pread returned, and a little
            assert amp is not None and 1.0 <= amp < 1.1, f
        elif f["path"] in ("native", "mount"):  # the chunk files' bytes, at least those asked
            assert amp is not None and amp >= 0.99, f
    names = {(r["name"], r["request"]) for r in doc["ratios"]}
    assert ("native / local O_DIRECT", 4096) in names
    assert (("mount / native", 4096) in names) == HAS_FUSE
    for r in doc["ratios"]:
        assert r["median"] > 0 and r["min"] <= r["median"] <= r["max"], r
    assert len(doc["load_before"]) == len(doc["load_after"]) == 3
    assert list(tmp_path.iterdir()) == []  # the work directory went, the mounts with it


def test_tables_fit_80_columns_and_targets_are_listed(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        bench,
        [
            "random",
            "--quick",
            "--no-mount",
            "--no-juicefs",
            "--sizes",
            "64KiB",
            "--dir",
            str(tmp_path),
        ],
        catch_exceptions=False,
        env={"COLUMNS": "80"},
    )
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    text = out.stdout
    assert "native client" in text and "local O_DIRECT" in text and "64KiB" in text
    assert "mount not measured: left out (--no-mount)" in " ".join(text.split())
    assert "native client read amplification, 64KiB" in text  # a target for >= 64 KiB


def test_offsets_are_aligned_inside_the_file_and_repeatable() -> None:
    got = offsets(16 << 20, 4096, 500, seed=7)
    assert got == offsets(16 << 20, 4096, 500, seed=7)
    assert all(o % 4096 == 0 and 0 <= o <= (16 << 20) - 4096 for o in got)
    assert len(set(got)) == 500  # distinct while the file has room
    more = offsets(8 * 4096, 4096, 20, seed=1)  # more requests than places: repeats
    assert len(more) == 20 and set(more) <= {k * 4096 for k in range(8)}


@pytest.mark.parametrize(
    ("sizes", "requests", "rounds"),
    [((1000,), 10, 1), ((8192,), 0, 1), ((8192,), 10, 0), ((), 10, 1), ((2 << 20,), 10, 1)],
)
def test_bad_arguments_are_refused(sizes: tuple[int, ...], requests: int, rounds: int) -> None:
    with pytest.raises(InvalidArgumentError):
        check_arguments(1 << 20, requests, sizes, rounds)
