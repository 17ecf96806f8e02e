"""The checkpoint of an LLM as MLPerf Storage v2.0 writes it: who writes which file, how big.

A mirror of DLIO's checkpointing maths (DLIO is the tool MLPerf Storage runs). Sources, read
for this module; figures below cite them by the short names on the left:

- ``DLIO``: mlcommons/storage ``dlio_benchmark/dlio_benchmark/checkpointing/base_checkpointing.py``
  @ 0e39e8f8db8f4df25306e64c29a72546413cf997 (the DLIO copy MLPerf Storage ships; the same
  maths as argonne-lcf/dlio_benchmark's file of that name), and ``pytorch_checkpointing.py``
  beside it (each file is one ``torch.save`` of a dict of tensors).
- ``CFG``: mlcommons/storage ``configs/dlio/workload/llama3_{8b,70b,405b,1t}.yaml`` @
  7e73663b64a7b49ad542527bc3b2040c7e7a446e (8b), e45a16138aded34992ae46639814529e093e2f47
  (70b), e3ffed051b176a5acc82196127d11d4bab69664c (405b),
  1d3bbf1c1679be5ef3d8806d88ce108f80773b6c (1t).
- ``RULES``: mlcommons/storage ``Submission_guidelines.md`` @
  03ef5ec0f44645eb00a7f3a11702ccf4f67df52e (v2.0 rules), section 2.2.1, Table 2: the models,
  TPxPPxDP, ZeRO stage, MPI process counts, published sizes.

What DLIO writes, per rank ``r`` (tp = r % TP, pp = (r // TP) % PP, dp = r // (TP·PP),
mp = r % (TP·PP); DP = ranks // (TP·PP)):

- Parameters (DLIO ``get_num_parameters``), with head = hidden // heads and
  kv = head·kv_heads: 2·vocab·hidden (embedding, lm_head) + hidden (final norm) + layers x
  (2·hidden norms + hidden·(hidden + 2·kv) QKV + hidden² output + 3·hidden·ffn gated MLP).
- Model state, ``model_dtype``: layer 0 (embedding) goes to pipeline stage 0, layers L+1
  (lm_head) and L+2 (final norm) to the last, transformer layers 1..L split in order (the
  first L % PP stages one more). Matrices are split over TP, norms are not; under ZeRO 3 every
  tensor is also split over DP. Each split is an integer division, as in DLIO.
- ZeRO 0 and 3: the rank's layers go in one file
  ``zero_pp_rank_{dp}_mp_rank_{mp}_model_states``. ZeRO 1 and 2: only DP rank 0 writes the
  model, one file per layer ``layer_{i}-model_{mp}_model_states`` when PP > 1, else one
  ``model_{mp}_model_states``.
- Optimizer state, ``optimizer_dtype``: every rank writes
  ``zero_pp_rank_{dp}_mp_rank_{mp}_optim_states``, three groups of ``parameters // (DP·TP·PP)``
  elements (fp32 master weights, Adam's momentum and variance, we take it: DLIO does not name
  them), each with ``5·hidden`` more elements.
- ZeRO 0: only the first TP·PP ranks write (model as under ZeRO 3 without the DP split;
  optimizer groups of ``parameters // (TP·PP)``); the other ranks write nothing.

Sizes count tensor bytes only, as DLIO reports them (``torch.save`` adds a little framing).
With fp16 weights and three fp32 copies that is 14 bytes a parameter, plus the small terms.

Scaling: ``scale`` S in (0, 1] multiplies every file's size: ``max(1, floor(size · S))``
bytes, so every file DLIO writes is still written (at least one byte) and the totals are the
sums of the scaled files. S = 1 gives DLIO's sizes exactly (but for a file whose tensors all
round down to nothing, possible only with toy dimensions: DLIO writes it, here it gets 1 byte).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import Literal

from tectonic_emu.errors import InvalidArgumentError

# Bytes per element of DLIO's datatypes (DLIO ``get_datatype_size``).
DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"int8": 1, "uint8": 1, "fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}
)

# The optimizer's groups: three copies of the parameter shard, each with 5·hidden elements
# more (DLIO ``get_optimization_groups``).
OPTIMIZER_GROUPS = 3
OPTIMIZER_EXTRA_PER_HIDDEN = 5

FileKind = Literal["model", "optimizer"]


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, not {value!r}")


@dataclass(frozen=True, slots=True)
class Transformer:
    """A Llama-style decoder's dimensions, as named in the MLPerf configs (``CFG``)."""

    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "ffn_hidden_size",
            "num_layers",
            "vocab_size",
            "num_attention_heads",
            "num_kv_heads",
        ):
            _require_positive_int(name, getattr(self, name))

    @property
    def kv_dim(self) -> int:
        """Columns of K (and of V): head size (rounded down, as DLIO does) x KV heads."""
        return self.hidden_size // self.num_attention_heads * self.num_kv_heads

    def layer_tensors(self, layer: int) -> tuple[tuple[int, bool], ...]:
        """Elements of each tensor of ``layer`` (0..L+2), each with whether TP splits it."""
        h, last = self.hidden_size, self.num_layers
        if not 0 <= layer <= last + 2:
            raise InvalidArgumentError(f"layer {layer} is not in 0..{last + 2}")
        if layer in (0, last + 1):  # embedding, lm_head
            return ((self.vocab_size * h, True),)
        if layer == last + 2:  # final norm
            return ((h, False),)
        return (
            (h, False),  # input norm
            (h * (h + 2 * self.kv_dim), True),  # QKV
            (h * h, True),  # attention output
            (h, False),  # post-attention norm
            (2 * h * self.ffn_hidden_size, True),  # gate and up projections (gated MLP)
            (h * self.ffn_hidden_size, True),  # down projection
        )

    @property
    def parameters(self) -> int:
        """Parameters of the whole model (DLIO ``get_num_parameters``)."""
        return sum(
            elements
            for layer in range(self.num_layers + 3)
            for elements, _ in self.layer_tensors(layer)
        )


@dataclass(frozen=True, slots=True)
class Parallelism:
    """Tensor and pipeline parallel degrees and the ZeRO stage; DP follows from the ranks."""

    tensor: int
    pipeline: int
    zero_stage: int

    def __post_init__(self) -> None:
        _require_positive_int("tensor parallelism", self.tensor)
        _require_positive_int("pipeline parallelism", self.pipeline)
        if isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 1, 2, 3):
            raise InvalidArgumentError(f"ZeRO stage must be 0, 1, 2 or 3, not {self.zero_stage!r}")

    @property
    def model_parallel(self) -> int:
        """Ranks holding one copy of the model: TP x PP."""
        return self.tensor * self.pipeline


@dataclass(frozen=True, slots=True)
class CheckpointModel:
    """A model as MLPerf Storage checkpoints it: dimensions, layout, dtypes, default ranks."""

    name: str
    dims: Transformer
    parallelism: Parallelism
    ranks: int  # the CLOSED division's MPI process count (RULES Table 2)
    model_dtype: str = "fp16"
    optimizer_dtype: str = "fp32"

    def __post_init__(self) -> None:
        _require_positive_int("ranks", self.ranks)
        for what, dtype in (("model", self.model_dtype), ("optimizer", self.optimizer_dtype)):
            if dtype not in DTYPE_BYTES:
                raise InvalidArgumentError(
                    f"{what} dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}"
                )
        self.check_ranks(self.ranks)

    @property
    def bytes_per_parameter(self) -> int:
        """Model dtype plus the optimizer's three copies: 2 + 3·4 = 14 for fp16 and fp32."""
        return DTYPE_BYTES[self.model_dtype] + OPTIMIZER_GROUPS * DTYPE_BYTES[self.optimizer_dtype]

    def check_ranks(self, ranks: int) -> None:
        """Raise ``InvalidArgumentError`` unless ``ranks`` is a positive multiple of TP x PP."""
        _require_positive_int("ranks", ranks)
        mp = self.parallelism.model_parallel
        if ranks % mp:
            raise InvalidArgumentError(
                f"{self.name} needs ranks in multiples of TP x PP = "
                f"{self.parallelism.tensor} x {self.parallelism.pipeline} = {mp}, not {ranks}"
            )


@dataclass(frozen=True, slots=True)
class CheckpointFile:
    """One file a rank writes: its DLIO name (without ``.pt``), what it holds, its bytes."""

    rank: int
    name: str
    kind: FileKind
    size: int  # bytes to write, after scaling
    full_size: int  # bytes DLIO writes at full scale


@dataclass(frozen=True, slots=True)
class RankCheckpoint:
    """What one rank writes, with its place in the TP x PP x DP grid."""

    rank: int
    tensor_rank: int
    pipeline_rank: int
    data_rank: int
    files: tuple[CheckpointFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    """Every rank's files for one checkpoint of ``model`` on ``ranks`` ranks at ``scale``."""

    model: CheckpointModel
    ranks: int
    scale: float
    data_parallel: int
    per_rank: tuple[RankCheckpoint, ...]  # indexed by rank

    @property
    def files(self) -> tuple[CheckpointFile, ...]:
        return tuple(f for r in self.per_rank for f in r.files)

    @property
    def total(self) -> int:
        """Bytes written by all ranks, after scaling."""
        return sum(r.size for r in self.per_rank)

    @property
    def full_total(self) -> int:
        """Bytes DLIO writes at full scale."""
        return sum(f.full_size for f in self.files)

    def kind_total(self, kind: FileKind) -> int:
        """Bytes of the model (or of the optimizer) files, after scaling."""
        return sum(f.size for f in self.files if f.kind == kind)


def _llama3(
    name: str, dims: tuple[int, int, int, int, int], layout: tuple[int, int, int], ranks: int
) -> CheckpointModel:
    hidden, ffn, layers, heads, kv_heads = dims
    tp, pp, zero = layout
    # vocab 128256, fp16 model and fp32 optimizer in every CFG file.
    return CheckpointModel(
        name=name,
        dims=Transformer(hidden, ffn, layers, 128_256, heads, kv_heads),
        parallelism=Parallelism(tp, pp, zero),
        ranks=ranks,
    )


# (hidden, ffn, layers, heads, KV heads) and (TP, PP, ZeRO stage) from CFG; ranks = TP x PP x DP
# from RULES Table 2 (and mlcommons/storage mlpstorage/config.py LLM_ALLOWED_VALUES @ 1d3bbf1c:
# 8, 64, 512 and 1024 processes).
# llama3-70b: CFG says 128 heads (Meta's model has 64); DLIO's head size is then 64, and K and
# V are 8 x 64 wide. Kept as configured: it is what MLPerf writes.
# llama3-1t: not a released Llama; CFG and RULES define it. 25872 / 192 heads is not whole:
# DLIO rounds the head size down to 134.
MODELS: Mapping[str, CheckpointModel] = MappingProxyType(
    {
        m.name: m
        for m in (
            _llama3("llama3-8b", (4096, 14336, 32, 32, 8), (1, 1, 3), ranks=8),
            _llama3("llama3-70b", (8192, 28672, 80, 128, 8), (8, 1, 3), ranks=64),
            _llama3("llama3-405b", (16384, 53248, 126, 128, 8), (8, 32, 1), ranks=512),
            _llama3("llama3-1t", (25872, 98304, 128, 192, 32), (8, 64, 1), ranks=1024),
        )
    }
)


def get_model(name: str) -> CheckpointModel:
    """The model called ``name`` in ``MODELS``; ``InvalidArgumentError`` if there is none."""
    try:
        return MODELS[name]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown model {name!r}: choose one of {', '.join(MODELS)}"
        ) from None


def checkpoint_plan(
    model: str | CheckpointModel, ranks: int | None = None, scale: float = 1.0
) -> CheckpointPlan:
    """The files each of ``ranks`` ranks writes for one checkpoint of ``model``, scaled.

    ``ranks`` defaults to the model's MLPerf CLOSED count and must be a positive multiple of
    TP x PP (DP = ranks // (TP x PP), as MLPerf's OPEN division allows); ``scale`` must be in
    (0, 1]. Raises ``InvalidArgumentError`` for an unknown model or a bad ``ranks`` or ``scale``.
    """
    spec = get_model(model) if isinstance(model, str) else model
    ranks = spec.ranks if ranks is None else ranks
    spec.check_ranks(ranks)
    factor = _check_scale(scale)
    par, dims = spec.parallelism, spec.dims
    mp = par.model_parallel
    dp = ranks // mp
    model_bytes, opt_bytes = DTYPE_BYTES[spec.model_dtype], DTYPE_BYTES[spec.optimizer_dtype]
    zero = par.zero_stage

    # ZeRO 0: one copy of everything, on the first TP x PP ranks (DLIO ``rank_to_checkpoint``).
    opt_shard = dims.parameters // (mp if zero == 0 else mp * dp)
    opt_size = OPTIMIZER_GROUPS * (opt_shard + OPTIMIZER_EXTRA_PER_HIDDEN * dims.hidden_size)
    opt_size *= opt_bytes
    dp_split = dp if zero == 3 else 1

    def layer_size(layer: int) -> int:
        return model_bytes * sum(
            (n // par.tensor if by_tp else n) // dp_split for n, by_tp in dims.layer_tensors(layer)
        )

    def scaled(size: int) -> int:
        return max(1, math.floor(size * factor))

    per_rank: list[RankCheckpoint] = []
    for rank in range(ranks):
        tp_rank, pp_rank = rank % par.tensor, (rank // par.tensor) % par.pipeline
        dp_rank, mp_rank = rank // mp, rank % mp
        full: list[tuple[str, FileKind, int]] = []
        if zero > 0 or rank < mp:
            layers = _stage_layers(dims.num_layers, par.pipeline, pp_rank)
            stem = f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank}"
            if zero in (0, 3):
                if layers:  # a stage without layers (PP > layers) writes no model file
                    size = sum(map(layer_size, layers))
                    full.append((f"{stem}_model_states", "model", size))
            elif dp_rank == 0 and par.pipeline > 1:
                full += [
                    (f"layer_{i}-model_{mp_rank}_model_states", "model", layer_size(i))
                    for i in layers
                ]
            elif dp_rank == 0:
                size = sum(map(layer_size, layers))
                full.append((f"model_{mp_rank}_model_states", "model", size))
            full.append((f"{stem}_optim_states", "optimizer", opt_size))
        files = tuple(CheckpointFile(rank, n, k, scaled(s), s) for n, k, s in full)
        per_rank.append(RankCheckpoint(rank, tp_rank, pp_rank, dp_rank, files))
    return CheckpointPlan(spec, ranks, float(scale), dp, tuple(per_rank))


def _stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """Layer indices of pipeline ``stage`` (DLIO ``get_layer_index``)."""
    per, extra = divmod(num_layers, stages)
    start = stage * per + min(stage, extra) + 1
    end = start + per + (1 if stage < extra else 0) - 1
    if stage == 0:
        start = 0  # the embedding
    if stage == stages - 1:
        end = num_layers + 2  # lm_head and the final norm
    return range(start, end + 1)


def _check_scale(scale: float) -> Fraction:
    # S as the exact value of the float: floor(size · S) never rounds up across a byte.
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise InvalidArgumentError(f"scale must be a number in (0, 1], not {scale!r}")
    if not (math.isfinite(scale) and 0 < scale <= 1):
        raise InvalidArgumentError(f"scale must be in (0, 1], not {scale!r}")
    return Fraction(scale)


__all__ = [
    "DTYPE_BYTES",
    "MODELS",
    "CheckpointFile",
    "CheckpointModel",
    "CheckpointPlan",
    "FileKind",
    "Parallelism",
    "RankCheckpoint",
    "Transformer",
    "checkpoint_plan",
    "get_model",
]
