"""The MLPerf Storage v2.0 training workloads: unet3d, resnet50 and cosmoflow.

Every figure comes from the benchmark's DLIO workload configs in the mlcommons/storage
repository (``configs/dlio/workload/<name>_<accelerator>.yaml``), which the v2.0 submission
guidelines (``Submission_guidelines.md``, "MLPerf Storage V2.0 Benchmark Rules", Table 1 and
section 4) name as the workload definitions; each constant below cites its file and the commit
it was read at. The AU thresholds are those of the guidelines' Table 1 and of each config's
``metric.au``.

Scaling for a small machine: ``Workload.scaled(S)`` multiplies the record (sample) size and the
sample count by ``S`` (each rounded, at least 1), so a dataset holds about ``S**2`` of the
published bytes. The batch size and the emulated computation time per batch stay as published:
an emulated accelerator of a scaled workload asks the store for ``S`` times the published
bandwidth (``ScaledWorkload.demand_bytes_per_s``), which is how this 2-core machine can stand in
for many accelerators. DLIO draws record sizes around the mean with the published standard
deviation; ``clients.dataset.generate`` gives every record the (scaled) mean size, so an epoch's
bytes are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from tectonic_emu.errors import InvalidArgumentError

_REPO = "mlcommons/storage"


@dataclass(frozen=True, slots=True)
class Accelerator:
    """One emulated accelerator type of a workload: DLIO sleeps ``computation_time`` seconds
    per batch of ``batch_size`` samples in place of the training step."""

    name: str  # "h100", "a100"
    batch_size: int  # samples per batch per accelerator (reader.batch_size)
    computation_time: float  # seconds per batch (train.computation_time)


@dataclass(frozen=True, slots=True)
class Workload:
    """A training workload as published (unscaled)."""

    name: str
    record_bytes: float  # mean sample size (dataset.record_length_bytes)
    record_bytes_stdev: float  # its standard deviation (dataset.record_length_bytes_stdev)
    samples_per_file: int  # dataset.num_samples_per_file
    files: int  # dataset.num_files_train of the config (submissions size it to host memory)
    file_format: str  # dataset.format: "npz", "tfrecord"
    data_loader: str  # reader.data_loader: "pytorch", "tensorflow"
    accelerators: tuple[Accelerator, ...]
    au_threshold: float  # minimum accelerator utilization for a passing run
    sources: tuple[str, ...]  # the config files the figures come from

    @property
    def samples(self) -> int:
        """Samples per epoch: files x samples per file."""
        return self.files * self.samples_per_file

    def accelerator(self, name: str) -> Accelerator:
        """The accelerator type ``name`` (``h100``, ``a100``); InvalidArgumentError if the
        workload has no figures for it."""
        for acc in self.accelerators:
            if acc.name == name.lower():
                return acc
        known = ", ".join(a.name for a in self.accelerators)
        raise InvalidArgumentError(f"{self.name} has no accelerator {name!r} (known: {known})")

    def scaled(self, scale: float) -> ScaledWorkload:
        """This workload with record size and sample count multiplied by ``scale`` (0 < scale
        <= 1 for this machine; each rounded, at least 1)."""
        if not 0 < scale <= 1:
            raise InvalidArgumentError(f"scale must be in (0, 1], not {scale}")
        return ScaledWorkload(
            workload=self,
            scale=scale,
            record_bytes=max(1, round(self.record_bytes * scale)),
            samples=max(1, round(self.samples * scale)),
        )


@dataclass(frozen=True, slots=True)
class ScaledWorkload:
    """A workload scaled by ``scale``: what ``generate`` writes and a simulation replays."""

    workload: Workload
    scale: float
    record_bytes: int  # every sample's size
    samples: int  # samples per epoch

    @property
    def bytes(self) -> int:
        return self.record_bytes * self.samples

    def steps_per_epoch(self, accelerator: str, accelerators: int) -> int:
        """Batches each of ``accelerators`` emulated accelerators takes per epoch (the last
        one may be short: every sample is read exactly once)."""
        batch = self.workload.accelerator(accelerator).batch_size
        per_rank = -(-self.samples // max(1, accelerators))
        return -(-per_rank // batch)

    def demand_bytes_per_s(self, accelerator: str) -> float:
        """Bytes per second one emulated accelerator consumes when I/O never makes it wait."""
        acc = self.workload.accelerator(accelerator)
        return acc.batch_size * self.record_bytes / acc.computation_time


# configs/dlio/workload/unet3d_h100.yaml @ 7e73663b64a7b49ad542527bc3b2040c7e7a446e and
# configs/dlio/workload/unet3d_a100.yaml @ be18c3e5b1744142c23edb05c5b7b78fc806cdc0
# (mlcommons/storage): format npz, num_files_train 168, num_samples_per_file 1,
# record_length_bytes 146600628, record_length_bytes_stdev 68341808, data_loader pytorch,
# batch_size 7, computation_time 0.323 (h100) / 0.636 (a100), metric.au 0.90.
UNET3D = Workload(
    name="unet3d",
    record_bytes=146_600_628,
    record_bytes_stdev=68_341_808,
    samples_per_file=1,
    files=168,
    file_format="npz",
    data_loader="pytorch",
    accelerators=(Accelerator("h100", 7, 0.323), Accelerator("a100", 7, 0.636)),
    au_threshold=0.90,
    sources=(
        f"{_REPO}/configs/dlio/workload/unet3d_h100.yaml",
        f"{_REPO}/configs/dlio/workload/unet3d_a100.yaml",
    ),
)

# configs/dlio/workload/resnet50_h100.yaml @ ac0424faa81f14d1a542264f0316357e2f70f41f and
# configs/dlio/workload/resnet50_a100.yaml @ be18c3e5b1744142c23edb05c5b7b78fc806cdc0
# (mlcommons/storage): format tfrecord, num_files_train 1024, num_samples_per_file 1251,
# record_length_bytes 114660.07, data_loader tensorflow, batch_size 400, computation_time
# 0.224 (h100) / 0.435 (a100), metric.au 0.90. These configs give no
# record_length_bytes_stdev; 136075.82 is from argonne-lcf/dlio_benchmark
# dlio_benchmark/configs/workload/resnet50_h100.yaml @ 499a4dc98140843a073e88d89e821c163b538555
# (record_length_std), a DLIO config, not an MLPerf Storage one.
RESNET50 = Workload(
    name="resnet50",
    record_bytes=114_660.07,
    record_bytes_stdev=136_075.82,
    samples_per_file=1251,
    files=1024,
    file_format="tfrecord",
    data_loader="tensorflow",
    accelerators=(Accelerator("h100", 400, 0.224), Accelerator("a100", 400, 0.435)),
    au_threshold=0.90,
    sources=(
        f"{_REPO}/configs/dlio/workload/resnet50_h100.yaml",
        f"{_REPO}/configs/dlio/workload/resnet50_a100.yaml",
    ),
)

# configs/dlio/workload/cosmoflow_h100.yaml @ c25079c2400ca62c360cbf1e970295d0e2250029 and
# configs/dlio/workload/cosmoflow_a100.yaml @ e3ffed051b176a5acc82196127d11d4bab69664c
# (mlcommons/storage): format tfrecord, num_files_train 524288, num_samples_per_file 1,
# record_length_bytes 2828486, record_length_bytes_stdev 71311, data_loader tensorflow,
# batch_size 1, computation_time 0.00350 (h100) / 0.00551 (a100), metric.au 0.70.
COSMOFLOW = Workload(
    name="cosmoflow",
    record_bytes=2_828_486,
    record_bytes_stdev=71_311,
    samples_per_file=1,
    files=524_288,
    file_format="tfrecord",
    data_loader="tensorflow",
    accelerators=(Accelerator("h100", 1, 0.00350), Accelerator("a100", 1, 0.00551)),
    au_threshold=0.70,
    sources=(
        f"{_REPO}/configs/dlio/workload/cosmoflow_h100.yaml",
        f"{_REPO}/configs/dlio/workload/cosmoflow_a100.yaml",
    ),
)

WORKLOADS: dict[str, Workload] = {w.name: w for w in (UNET3D, RESNET50, COSMOFLOW)}


def workload_named(name: str) -> Workload:
    """The workload called ``name``; InvalidArgumentError if there is none."""
    try:
        return WORKLOADS[name.lower()]
    except KeyError:
        known = ", ".join(WORKLOADS)
        raise InvalidArgumentError(f"no workload {name!r} (known: {known})") from None


__all__ = [
    "COSMOFLOW",
    "RESNET50",
    "UNET3D",
    "WORKLOADS",
    "Accelerator",
    "ScaledWorkload",
    "Workload",
    "workload_named",
]
