"""The training emulation (clients/simulate.py) and the data / simulate commands."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clients.dataset import generate
from clients.simulate import LocalSource, train
from tectonic_emu import Cluster

DATA = "/data/resnet"


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "c"
    Cluster.create(path, nodes=4, encoding="r3", block_size=256 << 10)

    async def make() -> None:
        async with Cluster.open(path) as cluster:
            await generate(cluster.client(), "resnet50", 0.004, DATA)

    asyncio.run(make())
    return path


def test_emulated_accelerators_report_au_and_throughput(cluster_dir: Path) -> None:
    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            report = await train(
                cluster.client(), DATA, workload="resnet50", accelerators=4, epochs=2
            )
            assert report.steps >= 2 and 0 < report.au <= 1 and report.au_min <= report.au
            assert report.passed == (report.au >= 0.9)
            assert report.samples_per_s > 0 and report.mb_per_s > 0
            slow = await train(  # compute 10x faster than the published figure: I/O shows
                cluster.client(),
                DATA,
                workload="resnet50",
                accelerators=4,
                epochs=2,
                computation_time=0.0001,
                prefetch=0,
            )
            assert slow.au < report.au

    asyncio.run(main())


def test_a_local_copy_reads_the_same_samples(cluster_dir: Path, tmp_path: Path) -> None:
    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            client = cluster.client()
            local = tmp_path / DATA.lstrip("/")
            local.mkdir(parents=True)
            for name in await client.listdir(DATA):
                (local / name).write_bytes(await client.read(f"{DATA}/{name}"))
            native = await train(client, DATA, workload="resnet50", accelerators=3, epochs=1)
            copy = await train(
                client,
                DATA,
                workload="resnet50",
                accelerators=3,
                epochs=1,
                source=LocalSource(tmp_path),
                source_name="local",
            )
            assert copy.steps == native.steps and copy.source == "local"
            shutil.rmtree(local)

    asyncio.run(main())


def test_the_data_and_simulate_commands(cluster_dir: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "tectonic_emu", *args, "--cluster", str(cluster_dir)]
        return subprocess.run(cmd, capture_output=True, text=True)

    made = cli(
        "data", "generate", "--workload", "cosmoflow", "--scale", "0.0001", "--to", "/d/c", "--json"
    )
    assert made.returncode == 0, made.stderr
    summary = json.loads(made.stdout)
    assert summary["samples"] == 52 and summary["record_bytes"] == 283
    ran = cli(
        "simulate",
        "train",
        "--workload",
        "cosmoflow",
        "--data",
        "/d/c",
        "-n",
        "2",
        "--epochs",
        "1",
        "--json",
    )
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["accelerators"] == 2 and report["au_threshold"] == 0.7
    run2 = ["--workload", "cosmoflow", "--data", "/d/c", "-n", "4", "--epochs", "1"]
    two = cli("simulate", "train", *run2, "--processes", "2", "--json")
    assert two.returncode == 0, two.stderr
    both = json.loads(two.stdout)  # process 0's report covers all 4 accelerators
    assert both["accelerators"] == 4 and both["samples_per_s"] > 0
    odd = cli(
        "simulate",
        "train",
        "--workload",
        "cosmoflow",
        "--data",
        "/d/c",
        "-n",
        "3",
        "--processes",
        "2",
    )
    assert odd.returncode != 0 and "do not split over 2 processes" in odd.stderr
    own = cli(
        "simulate", "train", "--workload", "cosmoflow", "--scale", "0.0001", "-n", "2", "--json"
    )
    assert own.returncode == 0, own.stderr  # generated /datasets/cosmoflow-x0.0001 first
    assert json.loads(own.stdout)["accelerators"] == 2
    bad = cli("simulate", "train", "--workload", "unet3d", "--data", "/nope", "--json")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    for sub in (("data", "generate"), ("simulate", "train")):
        assert "Example:" in cli(*sub, "--help").stdout


@pytest.mark.parametrize("threshold", [0, 1, 2, 5, 8, 9, 100, 512])
def test_the_benchmark_finds_the_largest_passing_count(threshold: int) -> None:
    from bench.train import largest_passing
    from clients.simulate import TrainReport

    async def trial(n: int) -> TrainReport:
        passed = n <= threshold
        return TrainReport(
            "unet3d", "h100", n, 1, 1, 1.0 if passed else 0.5, 0, 0.9, passed, 0, 0, 0, 0, "x"
        )

    best, reports = asyncio.run(largest_passing(trial, limit=512))
    assert best == min(threshold, 512)
    assert len(reports) <= 2 * 10 + 1  # doubling, then halving
