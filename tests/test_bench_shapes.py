"""The shape of the store, hedge, fuse, ckpt and train benches, from results built by hand (no
benchmark runs): the JSON validates against the module's ``SCHEMA`` and a wrong type does not,
``table()`` renders, ``plot()`` writes PNGs, and the committed ``docs/bench-*.json`` validate."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
from rich.console import Console
from rich.table import Table

from bench import ckpt, fuse, hedge, qos, store, train
from bench.cli import SCHEMA_MODULES
from clients.simulate import TrainReport

DOCS = Path(__file__).resolve().parent.parent / "docs"


def store_result(served: bool = True) -> store.StoreBench:
    def enc(name: str, overhead: float, w: float, r: float) -> store.EncodingFigures:
        f = store.EncodingFigures(name, overhead, w, r, 0.81, 0.9, 0.6, [w, w], [r, r])
        if served:
            f.served_write_mb_s, f.served_read_mb_s = w * 0.9, r * 0.8
            f.served_vs_embedded_write, f.served_vs_embedded_read = 0.9, 0.8
            f.served_write_acked_mb_s = w * 1.1
            f.served_write_runs_mb_s, f.served_read_runs_mb_s = [w * 0.9], [r * 0.8]
        return f

    return store.StoreBench(
        size=512 << 20,
        block_size=8 << 20,
        runs=2,
        nodes=9,
        sync=True,
        cold_reads=True,
        directory="/tmp",
        raw_write_mb_s=1500.0,
        raw_read_mb_s=2400.0,
        raw_write_runs_mb_s=[1500.0, 1490.0],
        raw_read_runs_mb_s=[2400.0, 2390.0],
        encodings=[enc("r3", 3.0, 402.5, 1201.0), enc("rs-6-3", 1.5, 733.0, 1800.0)],
        served=served,
        write_ack={"embedded": "all", "served": "quorum"} if served else {"embedded": "all"},
    )


def hedge_result() -> hedge.HedgeBench:
    def case(name: str, w: float, r: float) -> hedge.CaseFigures:
        return hedge.CaseFigures(name, w, r, round(w / 500, 3), round(r / 1500, 3), 3, 5, 2, 1)

    cases = [case("baseline", 500, 1500), case("slow, hedged", 480, 1400)]
    cases.append(case("slow, unhedged", 120, 300))
    return hedge.HedgeBench(
        size=256 << 20,
        delay_s=0.2,
        runs=2,
        block_size=8 << 20,
        encodings={"r3": cases, "rs-6-3": copy.deepcopy(cases)},
        nodes={"r3": 5, "rs-6-3": 11},
    )


def fuse_result() -> fuse.FuseBench:
    return fuse.FuseBench(
        size=1 << 30,
        encoding="rs-6-3",
        runs=3,
        cold_reads=True,
        local_write_mb_s=1018.8,
        local_read_mb_s=1384.9,
        native_write_mb_s=509.0,
        native_read_mb_s=2397.0,
        mount_write_mb_s=543.0,
        mount_read_mb_s=1635.1,
        mount_vs_native_write=1.067,
        mount_vs_native_read=0.682,
        direct_write_mb_s=646.1,
        direct_read_mb_s=1927.1,
        direct_vs_native_write=1.269,
        direct_vs_native_read=0.804,
        runs_mb_s={"local_w": [1018.8], "mount_r": [1635.1]},
    )


def ckpt_result() -> ckpt.CkptBench:
    return ckpt.CkptBench(
        size=1 << 30,
        ranks=1024,
        encoding="rs-6-3",
        runs=3,
        raw_write_mb_s=1502.5,
        writer_mb_s=556.9,
        save_mb_s=477.3,
        async_mb_s=388.9,
        async_blocked_max_s=0.1479,
        save_s=2.2496,
        save_vs_writer=0.857,
        async_blocked_vs_save=0.066,
        runs_mb_s={"raw": [1502.5], "writer": [556.9], "save": [477.3], "async": [388.9]},
    )


def train_result() -> train.TrainBench:
    def report(n: int, passed: bool) -> TrainReport:
        au = 0.95 if passed else 0.7
        return TrainReport(
            "unet3d", "h100", n, 2, 58, au, au - 0.02, 0.9, passed, 40.0, 180.0, 10.0, 0.2, "local"
        )

    return train.TrainBench(
        record_bytes=4581947,
        samples=400,
        epochs=2,
        max_accelerators={"native": 8, "fsspec": 7, "local": 7},
        native_vs_local=1.143,
        trials={"native": [report(1, True), report(8, True), report(16, False)], "local": []},
    )


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation of the JSON document: ``value`` at ``path``."""

    def mutate(doc: dict[str, Any]) -> None:
        where = doc
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value

    return mutate


def qos_result() -> qos.QosBench:
    phases = [
        qos.Phase("loader alone", 180.0, 0.96),
        qos.Phase("checkpoint alone", None, None, 4.6, 0.22, 0.0, 1.0),
        qos.Phase("together, off", 176.0, 0.94, 3.6, 0.28),
        qos.Phase("together, fifo", 110.0, 0.6, 5.6, 0.18, 0.3, 0.7),
        qos.Phase("together, fair", 178.0, 0.95, 6.8, 0.15, 0.24, 0.76),
    ]
    return qos.QosBench(
        disk_model="hdd",
        depth=2,
        accelerators=2,
        checkpoint_bytes=1 << 30,
        checkpoint_ranks=8,
        dataset_bytes=1_400_000_000,
        rounds=1,
        phases=phases,
        median={p.case: p for p in phases},
        gold_kept=0.989,
        gold_kept_fifo=0.611,
        gold_kept_off=0.978,
        bronze_of_leftover=0.897,
        loadavg=[1.0, 1.2, 1.1],
    )


@dataclass(frozen=True)
class Shape:
    module: ModuleType
    build: Callable[[], Any]
    cells: tuple[str, ...]  # text the rendered table must show
    wrong: Callable[[dict[str, Any]], None]  # puts a wrong type into the JSON
    pngs: tuple[str, ...]


SHAPES = {
    "store": Shape(
        store,
        store_result,
        ("bench store: 512MiB per encoding, 2 runs (median), reads cold", "raw disk", "1500"),
        _set(("raw_write_mb_s",), "fast"),
        ("store-write.png", "store-read.png"),
    ),
    "hedge": Shape(
        hedge,
        hedge_result,
        ("node 0 slowed by 200 ms, 256MiB files", "slow, unhedged", "rs-6-3", "11", "0.24"),
        _set(("encodings", "r3", 0, "write_mb_s"), "500"),
        ("hedge-write.png", "hedge-read.png"),
    ),
    "fuse": Shape(
        fuse,
        fuse_result,
        ("bench fuse: 1GiB of rs-6-3, 1 MiB I/O, 3 runs", "mount --direct-io", "1927", "0.68"),
        _set(("mount_read_mb_s",), None),
        ("fuse-throughput.png",),
    ),
    "ckpt": Shape(
        ckpt,
        ckpt_result,
        ("bench ckpt: 1GiB over 1024 ranks, rs-6-3", "save (synchronized)", "0.86", "(0.07x)"),
        _set(("ranks",), "1024"),
        ("ckpt-throughput.png",),
    ),
    "qos": Shape(
        qos,
        qos_result,
        ("together, fair", "178", "95.0%", "gold kept: 99% with fair queueing", "24%"),
        _set(("phases", 0, "loader_mb_s"), "fast"),
        ("qos.png",),
    ),
    "train": Shape(
        train,
        train_result,
        ("bench train: unet3d, 400 records of", "fsspec", "native / local: 1.14"),
        _set(("trials", "native", 0, "au"), "0.95"),
        ("train-accelerators.png",),
    ),
}


def render(table: Table) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    return out.getvalue()


@pytest.mark.parametrize("name", SHAPES)
def test_json_validates_and_a_wrong_type_does_not(name: str) -> None:
    shape = SHAPES[name]
    doc = shape.build().to_dict()
    json.dumps(doc)  # plain JSON types only
    jsonschema.validate(doc, shape.module.SCHEMA)
    assert shape.module.SCHEMA["$id"] == f"tectonic-emu/bench-{name}/1"
    shape.wrong(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, shape.module.SCHEMA)


@pytest.mark.parametrize("name", SHAPES)
def test_an_unknown_field_fails(name: str) -> None:
    shape = SHAPES[name]
    doc = {**shape.build().to_dict(), "extra": 1}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, shape.module.SCHEMA)


@pytest.mark.parametrize("name", SHAPES)
def test_table_renders(name: str) -> None:
    shape = SHAPES[name]
    text = render(shape.module.table(shape.build()))
    for cell in shape.cells:
        assert cell in text, cell


@pytest.mark.parametrize("name", SHAPES)
def test_plot_writes_pngs(name: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    shape = SHAPES[name]
    written = shape.module.plot(shape.build(), tmp_path / "plots")
    assert [p.name for p in written] == list(shape.pngs)
    for p in written:
        assert p.read_bytes()[:4] == b"\x89PNG"


def test_store_served_table() -> None:
    assert store.served_table(store_result(served=False)) is None
    table = store.served_table(store_result())
    assert table is not None
    text = render(table)
    assert "served (node processes over TCP) vs embedded" in text
    assert "(to ack)" in text and "660" in text  # rs-6-3 served write: 733 x 0.9
    assert "Writes acknowledged: embedded when every chunk is durable, served at a quorum" in text


def test_store_json_without_served_validates() -> None:
    jsonschema.validate(store_result(served=False).to_dict(), store.SCHEMA)


def test_train_json_is_unchanged_by_typed_trials() -> None:
    res = train_result()
    assert res.to_dict()["trials"]["native"][1] == res.trials["native"][1].to_dict()


def test_size_text() -> None:
    assert store.size_text(512 << 20) == "512MiB"
    assert store.size_text(1 << 30) == "1GiB"
    assert store.size_text(3 << 29) == "1.5GiB"
    assert store.size_text(100) == "100B"


COMMITTED = {
    "bench-ckpt-1GiB-1024ranks.json": ckpt,
    "bench-fuse-1GiB.json": fuse,
    "bench-hedge-256MiB.json": hedge,
    "bench-served-512MiB.json": store,  # bench store --served
    "bench-train-unet3d.json": train,
}


@pytest.mark.parametrize("file", COMMITTED)
def test_committed_json_validates(file: str) -> None:
    jsonschema.validate(json.loads((DOCS / file).read_text()), COMMITTED[file].SCHEMA)


def test_committed_store_json_validates() -> None:
    # recorded before the served path; its served fields were added as "not measured"
    doc = json.loads((DOCS / "bench-store-512MiB.json").read_text())
    jsonschema.validate(doc, store.SCHEMA)


@pytest.mark.parametrize("name", [n for n in SCHEMA_MODULES if n not in ("posix", "random_reads")])
def test_committed_schema_is_the_code_schema(name: str) -> None:
    """docs/schemas/ is the documented JSON: a change in the code must be made there too
    (``tectonic-emu bench schema --write docs/schemas``), deliberately."""
    import importlib

    committed = json.loads((DOCS / "schemas" / f"bench-{name}.schema.json").read_text())
    module = importlib.import_module(f"bench.{name}")
    assert committed == json.loads(json.dumps(module.SCHEMA)), f"bench {name}: schema changed"
    jsonschema.Draft202012Validator.check_schema(committed)
