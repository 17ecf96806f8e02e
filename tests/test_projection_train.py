"""``simulate train --preset`` (``clients/projection_train.py``): the real training emulation,
shard streams and checkpoints on model servers in virtual time, and described datasets
(``dataset.generate_described``) that the real streams read and check."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.ckpt_models import checkpoint_plan
from clients.dataset import (
    DatasetCorruptError,
    DatasetIndex,
    ShardStream,
    generate_described,
    rank_order,
    read_shard,
)
from clients.projection import PRESETS, model_clients
from clients.projection_train import project_train, train_scenario
from clients.ranks import Timeline
from clients.simulate import Compute
from tectonic_emu import clock
from tectonic_emu.cli import cli as cli_main
from tectonic_emu.qos.pacing import BURST_S

SMALL = PRESETS["small-flash"]


def test_a_described_dataset_streams_in_the_real_order_and_is_checked() -> None:
    async def main() -> None:
        _, _, clients = await model_clients(SMALL.hardware, "rs-6-3", 1 << 20, 1, 16, 8, "quorum")
        c = clients[0]
        # shards of many chunks, read two chunks at a time: one 30 MB record each, or 400
        # records of 100 KB in row groups of 10; and shards of 800 KB, read whole
        for workload, record, samples, per_shard in (
            ("unet3d", 30_000_000, 12, None),
            ("resnet50", 100_000, 400, None),
            ("resnet50", 100_000, 60, 8),
        ):
            path = f"/d/{record}-{samples}"
            ix = await generate_described(
                c, workload, path, samples=samples, record_bytes=record, rows_per_shard=per_shard
            )
            assert ix.described and ix.rows == samples and ix.nbytes > samples * record
            for rank in range(3):
                got = []
                async with ShardStream(
                    c, path, rank=rank, world_size=3, batch_size=5, seed=7, epoch=1
                ) as s:
                    got += [b.column("index").to_numpy() async for b in s]
                want = rank_order(ix, rank=rank, world_size=3, seed=7, epoch=1)
                assert np.array_equal(np.concatenate(got), want)
            last = await read_shard(c, ix, len(ix.shards) - 1)
            assert last.column("index").to_pylist()[-1] == samples - 1
            # an index whose checksum does not match what was stored: the stream refuses it
            bad = ix.shards[0]
            groups = (dataclasses.replace(bad.row_groups[0], crc32c=bad.row_groups[0].crc32c ^ 1),)
            tampered = DatasetIndex(
                ix.path,
                ix.schema,
                (dataclasses.replace(bad, row_groups=groups + bad.row_groups[1:]),),
                ix.metadata,
            )
            await c.write_file(f"{path}/_index.json", tampered.to_json())
            with pytest.raises(DatasetCorruptError, match="CRC32C"):
                async with ShardStream(
                    c, path, rank=0, world_size=1, batch_size=5, seed=7, epoch=1, prefetch=0
                ) as s:
                    async for _ in s:
                        pass

    clock.run_virtual(main())


def _small(**kw: object) -> dict[str, object]:
    sc = train_scenario(
        SMALL,
        "resnet50",
        16,
        steps=6,
        scale=0.1,
        checkpoint="llama3-8b",
        checkpoint_scale=0.05,
        every=3,
        **kw,  # type: ignore[arg-type]
    )
    out = project_train(sc).to_json()
    out.pop("wall_s")
    return out


@pytest.mark.parametrize("async_save", [False, True])
def test_checkpoint_bursts_dip_the_au_and_the_run_is_deterministic(async_save: bool) -> None:
    p = _small(async_save=async_save)
    r = p["report"]
    assert isinstance(r, dict)
    assert r["steps"] == 6 and r["accelerators"] == 16 and p["hosts"] == 2
    assert [b["step"] for b in r["bursts"]] == [3, 6]
    for b in r["bursts"]:
        assert b["end_s"] > b["start_s"] and b["au"] < r["au_between"]
        assert 0 < b["blocked_p50_s"] <= b["blocked_max_s"]
    assert r["checkpoint_s"] > 0 and 0 < r["au"] < r["au_between"] <= 1
    assert all(0 <= au <= 1 for _, au in r["au_timeline"])
    assert min(au for _, au in r["au_timeline"]) < 0.5 < max(au for _, au in r["au_timeline"])
    if async_save:  # staged, not committed: ranks are blocked for less than the burst
        assert all(b["blocked_max_s"] < b["end_s"] - b["start_s"] for b in r["bursts"])
    assert json.dumps(p) == json.dumps(_small(async_save=async_save))


def test_servers_fair_queue_loaders_and_checkpoints_when_asked() -> None:
    """With ``--qos fair`` the model servers run the real fair queues: the ranks' streams
    are the gold group, their checkpoints the bronze one, each counted on the disks; without
    it, no scheduler and no figures (the projections before issue 23)."""
    hw = dataclasses.replace(SMALL.hardware, qos="fair")
    fair = _small(async_save=True, hardware=hw)
    assert fair["qos"] == "fair"
    groups = fair["groups"]
    assert isinstance(groups, dict)
    assert groups["loaders"]["class"] == "gold" and groups["checkpoints"]["class"] == "bronze"
    assert groups["loaders"]["bytes"] > 0 and groups["checkpoints"]["bytes"] > 0
    assert json.dumps(fair) == json.dumps(_small(async_save=True, hardware=hw))
    off = _small(async_save=True)
    assert off["qos"] == "off" and off["groups"] == {}


def test_a_paced_checkpoint_lasts_its_largest_host_over_the_rate() -> None:
    """Each host's checkpoint writes are paced on their own, so a burst lasts at least the
    most any one host writes over the rate (DLIO's layout puts the model's files on the
    first replica's ranks: at 24,576 ranks 31 GB on host 0 against 1.9 GB on the mean)."""
    plan = checkpoint_plan("llama3-8b", 16, 0.05)
    hosts = [sum(r.size for r in plan.per_rank[h * 8 : (h + 1) * 8]) for h in range(2)]
    free = _small(async_save=True)
    assert free["checkpoint_host_bytes"] == max(hosts)
    rate = max(hosts) / 2.0  # two seconds of writes for the largest host
    paced = _small(async_save=True, checkpoint_rate=rate)
    for b, unpaced in zip(paced["report"]["bursts"], free["report"]["bursts"], strict=True):  # type: ignore[index]
        assert unpaced["end_s"] - unpaced["start_s"] < 2.0 - BURST_S
        assert b["end_s"] - b["start_s"] >= 2.0 - BURST_S


def test_training_without_checkpoints_has_no_bursts() -> None:
    sc = train_scenario(SMALL, "resnet50", 8, steps=4, scale=0.1)
    r = project_train(sc).report
    assert r.bursts == [] and r.checkpoint_s == 0 and r.steps == 4 and r.au > 0.5


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.floats(0, 10), st.floats(0, 3)), max_size=6), min_size=1, max_size=4
    ),
    st.floats(0, 12),
    st.floats(0, 4),
)
def test_au_of_an_interval_is_the_overlap_of_compute_spans(
    ranks: list[list[tuple[float, float]]], a: float, width: float
) -> None:
    timelines = []
    for spans in ranks:
        t = Timeline()
        for start, length in spans:
            t.add("compute", start, start + length)
            t.add("io", start, start + 1)  # not computing: not counted
        timelines.append(t)
    b = a + width
    overlap = sum(max(0.0, min(b, s + n) - max(a, s)) for spans in ranks for s, n in spans)
    want = min(1.0, overlap / (len(ranks) * width)) if width > 0 else 0.0
    # prefix sums of up to 24 spans of times up to 13 s lose about 1e-13 s to rounding,
    # which an interval of `width` seconds divides: the test's tolerance, not the model's
    tolerance = 1e-9 + (1e-12 / (len(ranks) * width) if width > 0 else 0.0)
    assert Compute(timelines).au(a, b) == pytest.approx(want, abs=tolerance)


def test_the_command_projects_and_refuses_mixed_options() -> None:
    runner = CliRunner()
    args = ["simulate", "train", "--preset", "small-flash", "--workload", "resnet50", "-n", "8"]
    args += ["--steps", "4", "--scale", "0.1"]
    got = runner.invoke(cli_main, [*args, "--checkpoint", "llama3-8b", "--every", "2",
                                   "--checkpoint-scale", "0.05"])  # fmt: skip
    assert got.exit_code == 0, got.output
    assert "after step" in got.output and "AU" in got.output
    assert max(len(line) for line in got.output.splitlines()) <= 80
    as_json = json.loads(runner.invoke(cli_main, [*args, "--json"]).output)
    assert as_json["report"]["steps"] == 4
    mixed = runner.invoke(cli_main, [*args, "--epochs", "2"])
    assert mixed.exit_code != 0 and "--epochs" in mixed.output
    alone = runner.invoke(
        cli_main,
        ["simulate", "train", "--workload", "resnet50", "--checkpoint", "llama3-8b"],
        env={"TECTONIC_EMU_CLUSTER": ""},
    )
    assert alone.exit_code != 0
