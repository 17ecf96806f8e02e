"""The checkpoint maths of clients/ckpt_models.py against MLPerf Storage v2.0's published sizes and
DLIO's rules for who writes what. Pure arithmetic: no cluster, no files."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients.ckpt_models import (
    MODELS,
    CheckpointModel,
    CheckpointPlan,
    Parallelism,
    Transformer,
    checkpoint_plan,
    get_model,
)
from tectonic_emu.errors import InvalidArgumentError

GIB = 1 << 30

# Published checkpoint sizes: mlcommons/storage Submission_guidelines.md @ 03ef5ec0, section
# 2.2.1, Table 2: "105 GB", "912 GB", "5.29 TB" (and "18 TB" for llama3-1t).
#
# The unit is GiB although it reads "GB": DLIO divides by 1024**3 and prints "GB" (its
# base_checkpointing.py, "Total checkpoint size"), and llama3-8b writes 112.4e9 bytes, which is
# 104.7 GiB ("105") but 112 decimal GB. "5.29 TB" is 5,290 of those GiB: 405b writes
# 5,292 GiB, which is 5.17 TiB or 5.68 decimal TB, so no other reading gives 5.29.
#
# Tolerance: half a unit of the last published digit, the most rounding can hide:
# 105 +- 0.5 GiB, 912 +- 0.5 GiB, 5.29 TB = 5,290 +- 5 GiB.
PUBLISHED_GIB = {
    "llama3-8b": (105.0, 0.5),
    "llama3-70b": (912.0, 0.5),
    "llama3-405b": (5290.0, 5.0),
}


@pytest.mark.parametrize(
    "name",
    [
        "llama3-8b",
        pytest.param(
            "llama3-70b",
            marks=pytest.mark.xfail(
                strict=True,
                reason="DLIO's maths gives 911.21 GiB, 0.79 GiB under the published 912; "
                "mlpstorage's own per-part estimate (130 + 781 GiB) sums to 911 too",
            ),
        ),
        "llama3-405b",
    ],
)
def test_full_scale_total_matches_the_published_size(name: str) -> None:
    published, tolerance = PUBLISHED_GIB[name]
    plan = checkpoint_plan(name)
    assert plan.total == plan.full_total
    assert abs(plan.total / GIB - published) <= tolerance, plan.total / GIB


def test_llama3_70b_matches_mlpstorage_own_estimate() -> None:
    # mlcommons/storage mlpstorage/config.py @ 1d3bbf1c, LLM_SIZE_BY_RANK: llama3-70b is
    # (130, 781) (model GB, optimizer GB), in whole GiB. Our parts round to the same.
    plan = checkpoint_plan("llama3-70b")
    assert round(plan.kind_total("model") / GIB) == 130
    assert round(plan.kind_total("optimizer") / GIB) == 781


def test_full_scale_bytes_are_dlio_s() -> None:
    # Exact bytes for the MLPerf layouts, worked out by hand from DLIO's formulas: 14 bytes
    # a parameter, plus 3 x 5 x hidden fp32 elements per writing rank, plus the norms that
    # every TP rank keeps whole.
    expected = {
        "llama3-8b": (8_030_261_248, 112_425_623_552),
        "llama3-70b": (69_882_617_856, 978_406_572_032),
        "llama3-405b": (405_853_388_800, 5_682_508_791_808),
        "llama3-1t": (1_183_035_102_480, 16_564_174_094_592),
    }
    for name, (parameters, total) in expected.items():
        model = get_model(name)
        assert model.dims.parameters == parameters
        assert model.bytes_per_parameter == 14
        assert checkpoint_plan(name).total == total


def test_default_ranks_are_mlperf_closed_counts() -> None:
    # Submission_guidelines.md @ 03ef5ec0, 2.2.1: 8, 64, 512 and 1024 MPI processes.
    ranks = {name: checkpoint_plan(name).ranks for name in MODELS}
    assert ranks == {"llama3-8b": 8, "llama3-70b": 64, "llama3-405b": 512, "llama3-1t": 1024}
    assert {n: checkpoint_plan(n).data_parallel for n in MODELS} == {
        "llama3-8b": 8,
        "llama3-70b": 8,
        "llama3-405b": 2,
        "llama3-1t": 2,
    }


def check_plan(plan: CheckpointPlan) -> None:
    """What holds for every plan: per-rank sums, unique names, sizes, rank grid."""
    par = plan.model.parallelism
    assert len(plan.per_rank) == plan.ranks == plan.data_parallel * par.model_parallel
    assert sum(r.size for r in plan.per_rank) == plan.total
    assert plan.kind_total("model") + plan.kind_total("optimizer") == plan.total
    names = [f.name for f in plan.files]
    assert len(names) == len(set(names))
    for index, rank in enumerate(plan.per_rank):
        assert rank.rank == index
        assert index == (
            rank.tensor_rank + par.tensor * (rank.pipeline_rank + par.pipeline * rank.data_rank)
        )
        assert all(f.rank == index and f.size >= 1 for f in rank.files)


@pytest.mark.parametrize("name", list(MODELS))
def test_mlperf_plans_are_consistent(name: str) -> None:
    check_plan(checkpoint_plan(name))


def test_zero3_every_rank_writes_a_model_and_an_optimizer_shard() -> None:
    plan = checkpoint_plan("llama3-8b")  # ZeRO 3, TP 1, PP 1, DP 8
    for rank in plan.per_rank:
        d = rank.data_rank
        assert [(f.name, f.kind) for f in rank.files] == [
            (f"zero_pp_rank_{d}_mp_rank_0_model_states", "model"),
            (f"zero_pp_rank_{d}_mp_rank_0_optim_states", "optimizer"),
        ]
    parameters = get_model("llama3-8b").dims.parameters
    # Everything divides evenly here: each rank holds 1/8 of the fp16 weights.
    assert {r.files[0].size for r in plan.per_rank} == {2 * parameters // 8}


def test_zero1_only_the_first_data_parallel_replica_writes_the_model() -> None:
    plan = checkpoint_plan("llama3-405b")  # ZeRO 1, TP 8, PP 32, DP 2
    dims = get_model("llama3-405b").dims
    for rank in plan.per_rank:
        kinds = Counter(f.kind for f in rank.files)
        assert kinds["optimizer"] == 1
        assert (kinds["model"] > 0) == (rank.data_rank == 0)
    # With PP > 1, one file per layer: the 129 layer indices (embedding, 126 layers, lm_head,
    # final norm) once for each of the 8 TP ranks.
    for tp in range(8):
        layers = [
            int(f.name.split("_")[1].split("-")[0])
            for r in plan.per_rank
            if r.tensor_rank == tp
            for f in r.files
            if f.kind == "model"
        ]
        assert sorted(layers) == list(range(dims.num_layers + 3))
    first, last = plan.per_rank[0], plan.per_rank[31 * 8]
    # 126 layers over 32 stages: the first 30 stages get 4, the last two 3.
    assert [f.name for f in first.files if f.kind == "model"] == [
        f"layer_{i}-model_0_model_states" for i in range(5)
    ]
    assert [f.name for f in last.files if f.kind == "model"] == [
        f"layer_{i}-model_248_model_states" for i in range(124, 129)
    ]


def test_zero1_without_pipeline_writes_one_model_file() -> None:
    model = dataclasses.replace(get_model("llama3-70b"), parallelism=Parallelism(8, 1, 1))
    plan = checkpoint_plan(model)
    for rank in plan.per_rank:
        names = [f.name for f in rank.files]
        stem = f"zero_pp_rank_{rank.data_rank}_mp_rank_{rank.tensor_rank}"
        if rank.data_rank == 0:
            assert names == [f"model_{rank.tensor_rank}_model_states", f"{stem}_optim_states"]
        else:
            assert names == [f"{stem}_optim_states"]


def test_zero_stage_moves_the_model_bytes_but_not_their_total() -> None:
    base = get_model("llama3-8b")  # every split divides evenly
    totals = {}
    for stage in (1, 2, 3):
        model = dataclasses.replace(base, parallelism=Parallelism(1, 1, stage))
        plan = checkpoint_plan(model)
        writers = {f.rank for f in plan.files if f.kind == "model"}
        assert writers == ({0} if stage < 3 else set(range(8)))
        totals[stage] = plan.total
    assert totals[1] == totals[2] == totals[3] == checkpoint_plan(base).total


def test_zero0_only_one_model_parallel_group_writes() -> None:
    base = get_model("llama3-70b")
    model = dataclasses.replace(base, parallelism=Parallelism(8, 1, 0))
    plan = checkpoint_plan(model)
    for rank in plan.per_rank:
        assert (len(rank.files) == 2) == (rank.rank < 8)
        assert len(rank.files) in (0, 2)
    h, parameters = base.dims.hidden_size, base.dims.parameters
    optim = plan.per_rank[0].files[1]
    assert optim.size == 4 * 3 * (parameters // 8 + 5 * h)


def test_more_ranks_shrink_optimizer_shards_but_keep_the_zero1_model() -> None:
    closed = checkpoint_plan("llama3-405b")
    wider = checkpoint_plan("llama3-405b", ranks=4 * 256)  # OPEN: DP 4
    assert wider.data_parallel == 4
    assert wider.kind_total("model") == closed.kind_total("model")
    dims = get_model("llama3-405b").dims
    for plan in (closed, wider):
        shard = 4 * 3 * (dims.parameters // plan.ranks + 5 * dims.hidden_size)
        assert {f.size for f in plan.files if f.kind == "optimizer"} == {shard}


@st.composite
def plans(draw: st.DrawFn) -> CheckpointPlan:
    heads = draw(st.integers(1, 8))
    dims = Transformer(
        hidden_size=draw(st.integers(1, 64)) * heads,
        ffn_hidden_size=draw(st.integers(1, 256)),
        num_layers=draw(st.integers(1, 12)),
        vocab_size=draw(st.integers(1, 1000)),
        num_attention_heads=heads,
        num_kv_heads=draw(st.integers(1, heads)),
    )
    par = Parallelism(
        tensor=draw(st.integers(1, 4)),
        pipeline=draw(st.integers(1, dims.num_layers + 3)),  # more stages than layers too
        zero_stage=draw(st.integers(0, 3)),
    )
    dp = draw(st.integers(1, 4))
    model = CheckpointModel("small", dims, par, ranks=par.model_parallel * dp)
    scale = draw(st.sampled_from([1.0, 0.5]) | st.floats(1e-6, 1.0))
    return checkpoint_plan(model, scale=scale)


@given(plans())
def test_any_layout_follows_dlio_s_rules(plan: CheckpointPlan) -> None:
    check_plan(plan)
    model = plan.model
    par, dims, dp = model.parallelism, model.dims, plan.data_parallel
    mp = par.model_parallel
    writers = [r for r in plan.per_rank if r.files]
    assert len(writers) == (mp if par.zero_stage == 0 else plan.ranks)
    # One optimizer file per writing rank, of the size DLIO gives it.
    shard = dims.parameters // (mp if par.zero_stage == 0 else mp * dp)
    full = 4 * 3 * (shard + 5 * dims.hidden_size)
    optim = [f for f in plan.files if f.kind == "optimizer"]
    assert len(optim) == len(writers) and {f.full_size for f in optim} == {full}
    model_writers = {f.rank for f in plan.files if f.kind == "model"}
    # A rank holds layers unless its stage got none (more stages than layers).
    with_layers = {
        r.rank
        for r in writers
        if r.pipeline_rank in (0, par.pipeline - 1) or r.pipeline_rank < dims.num_layers
    }
    if par.zero_stage in (1, 2):
        assert model_writers == {r for r in with_layers if plan.per_rank[r].data_rank == 0}
        if par.pipeline > 1:  # one file per layer, each layer once per TP rank
            model_files = [f for f in plan.files if f.kind == "model"]
            assert len(model_files) == par.tensor * (dims.num_layers + 3)
    else:
        assert model_writers == with_layers
    if par.zero_stage != 3 and par.tensor == 1:
        # Nothing is split: the model files hold every parameter once, in fp16.
        assert sum(f.full_size for f in plan.files if f.kind == "model") == 2 * dims.parameters


@given(plans(), st.floats(min_value=0.0, max_value=1.0, exclude_min=True))
def test_scale_multiplies_every_file(plan: CheckpointPlan, scale: float) -> None:
    full = checkpoint_plan(plan.model, plan.ranks)
    scaled = checkpoint_plan(plan.model, plan.ranks, scale)
    assert [(f.rank, f.name, f.kind, f.full_size) for f in scaled.files] == [
        (f.rank, f.name, f.kind, f.full_size) for f in full.files
    ]
    assert all(f.size == max(1, f.full_size) for f in full.files)
    for f in scaled.files:  # exact: a float times a size can round up across a whole byte
        assert f.size == max(1, math.floor(f.full_size * Fraction(scale)))
    assert scaled.total <= full.total
    assert scaled.full_total == full.full_total


def test_scale_keeps_at_least_one_byte_per_file() -> None:
    plan = checkpoint_plan("llama3-1t", scale=1e-15)
    assert len(plan.files) == 2072
    assert {f.size for f in plan.files} == {1}
    assert plan.total == 2072


def test_scale_of_one_hundredth() -> None:
    plan = checkpoint_plan("llama3-405b", scale=0.01)
    # Flooring loses under a byte per file.
    assert 0 <= 0.01 * plan.full_total - plan.total < len(plan.files)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "llama3-13b"}, "unknown model 'llama3-13b'"),
        ({"model": "llama3-405b", "ranks": 100}, "multiples of TP x PP = 8 x 32 = 256, not 100"),
        ({"model": "llama3-70b", "ranks": 12}, "multiples of TP x PP = 8 x 1 = 8, not 12"),
        ({"model": "llama3-8b", "ranks": 0}, "ranks must be a positive integer"),
        ({"model": "llama3-8b", "ranks": -8}, "ranks must be a positive integer"),
        ({"model": "llama3-8b", "scale": 0.0}, "scale must be in (0, 1]"),
        ({"model": "llama3-8b", "scale": -0.5}, "scale must be in (0, 1]"),
        ({"model": "llama3-8b", "scale": 1.5}, "scale must be in (0, 1]"),
        ({"model": "llama3-8b", "scale": math.nan}, "scale must be in (0, 1]"),
        ({"model": "llama3-8b", "scale": math.inf}, "scale must be in (0, 1]"),
        ({"model": "llama3-8b", "scale": True}, "scale must be a number"),
    ],
)
def test_bad_input_is_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        checkpoint_plan(**kwargs)  # type: ignore[arg-type]
    assert message in str(caught.value)


def test_bad_models_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="hidden_size must be a positive integer"):
        Transformer(0, 1, 1, 1, 1, 1)
    with pytest.raises(InvalidArgumentError, match="ZeRO stage must be 0, 1, 2 or 3"):
        Parallelism(1, 1, 4)
    with pytest.raises(InvalidArgumentError, match="tensor parallelism must be"):
        Parallelism(0, 1, 1)
    base = get_model("llama3-8b")
    with pytest.raises(InvalidArgumentError, match="model dtype 'fp8'"):
        dataclasses.replace(base, model_dtype="fp8")
    with pytest.raises(InvalidArgumentError, match="multiples of TP x PP"):
        dataclasses.replace(base, parallelism=Parallelism(3, 1, 3))
