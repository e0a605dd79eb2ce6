"""Device profiles: the hardware a simulation runs on, described physically.

A profile lists what was measured or published for one device (CPU clusters, GPU, NPU,
DRAM, storage); the hardware models in :mod:`sim.hw` derive service times from it and
nothing else. Every number in a bundled YAML file carries a comment naming its source or
saying ``assumed`` and why; curves record the range they were measured over so the
simulator can warn when asked to extrapolate.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sim.bundled import bundled_dir
from sim.profiles.schema import MIN_RATE, ByteSize, Strict, documentary

Positive = Field(gt=0)
Fraction = Field(ge=0, le=1)


class CurvePoint(Strict):
    """One point of a throughput curve: requests of ``block`` bytes reach ``gbps`` GB/s."""

    block: ByteSize
    gbps: float = Field(ge=MIN_RATE)


class RangePoint(Strict):
    """Random reads spread over ``span`` bytes of the device run at ``factor`` x nominal."""

    span: ByteSize
    factor: float = Field(ge=MIN_RATE, le=1.5)


def _sorted_blocks(points: list[CurvePoint]) -> list[CurvePoint]:
    blocks = [p.block for p in points]
    if blocks != sorted(blocks) or len(set(blocks)) != len(blocks):
        raise ValueError(f"points must have strictly increasing block sizes, got {blocks}")
    return points


class KernelSpeed(Strict):
    """Throughput of each CPU kernel class relative to the core's ``int8_gops``/``fp32_gflops``.

    Those figures are usually calibrated on one kernel (the bundled phones: a dense INT4
    prefill, i.e. a GEMM). Decode runs other kernels: dense GEMV (attention, LM head,
    predictors, dense FFNs) and sparse GEMV over gathered neuron rows (PowerInfer-2's
    clusters). A profile with microbenchmarks of those sets their ratios here; left out,
    every kernel runs at the calibrated rate.
    """

    gemm: float = Field(1.0, ge=MIN_RATE, le=100)
    dense_gemv: float = Field(1.0, ge=MIN_RATE, le=100)
    sparse_gemv: float = Field(1.0, ge=MIN_RATE, le=100)
    # Converting quantised weights to a format an accelerator computes on (see
    # Accelerator.formats), at DEQUANT_OPS_PER_WEIGHT operations per weight.
    dequant: float = Field(1.0, ge=MIN_RATE, le=100)


class CpuCluster(Strict):
    """Identical cores sharing a frequency domain."""

    # a word, so a field path can address the cluster by name (not a number, *, or dotted)
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")
    core: str = documentary("a label (the micro-architecture, e.g. Cortex-X4)", "")
    cores: int = Field(ge=1, le=64)
    freq_ghz: float = documentary("the datasheet's clock (the throughputs are what is simulated)", gt=0, le=10)
    # Dense fp32 GEMM throughput of one core (FMA lanes x 2 x GHz x achieved efficiency).
    fp32_gflops: float = Field(ge=MIN_RATE)
    # Integer dot-product throughput of one core (int8/int4 kernels, e.g. SDOT/SMMLA).
    int8_gops: float = Field(ge=MIN_RATE)
    # DRAM bandwidth one core can pull on its own streaming weights (GEMV is bound by it).
    mem_gbps: float = Field(ge=MIN_RATE)
    # 4 KiB random-read throughput when this core issues the I/O (it runs the UFS driver).
    io_4k_gbps: float = Field(ge=MIN_RATE)
    # Power while busy, for energy estimates (optional).
    active_w: float | None = Field(default=None, gt=0, le=1000)  # le: a typo, not a unit (see PowerProfile)
    # Per-kernel throughput relative to int8_gops / fp32_gflops (optional; see KernelSpeed).
    kernel_speed: KernelSpeed = Field(default_factory=KernelSpeed)


class CpuProfile(Strict):
    clusters: list[CpuCluster] = Field(min_length=1)
    # Bandwidth all CPU cores together reach (measured); below the sum of per-core values.
    mem_gbps: float = Field(ge=MIN_RATE)

    @field_validator("clusters")
    @classmethod
    def _unique_names(cls, clusters: list[CpuCluster]) -> list[CpuCluster]:
        names = [c.name for c in clusters]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster names must be unique, got {names}")
        return clusters

    def cluster(self, name: str) -> CpuCluster:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)


class EfficiencyPoint(Strict):
    """At ``batch`` rows per matrix product the unit reaches ``efficiency`` x its peak."""

    batch: int = Field(ge=1)
    efficiency: float = Field(ge=MIN_RATE, le=1)


class Accelerator(Strict):
    """A GPU or NPU: a roofline (peak ops, bandwidth) scaled by a batch-efficiency curve."""

    name: str = documentary("a label")
    fp16_tflops: float = Field(ge=MIN_RATE)
    int8_tops: float = Field(ge=MIN_RATE)
    mem_gbps: float = Field(ge=MIN_RATE)  # DRAM bandwidth this agent reaches alone
    # Fixed cost of each kernel launch (GPU) or graph switch / submission (NPU).
    launch_overhead_us: float = Field(ge=0)
    efficiency: list[EfficiencyPoint] = Field(min_length=1)
    # Weight formats the unit computes on directly. Weights in another format are converted
    # by the CPU first ([PI2 §4.1]: the NPU prefills while "the CPU dequantizes" INT4 weights).
    # Float weights (fp16, fp32) always run as they are: only quantised ones are converted.
    formats: list[Literal["fp16", "int8", "int4"]] = Field(default=["fp16", "int8", "int4"], min_length=1)
    # False: this unit has no fast gathered-row kernel, so a product over a subset of a
    # matrix's rows costs the whole matrix there (llm-in-flash's predicted-row products).
    sparse_kernels: bool = False
    active_w: float | None = Field(default=None, gt=0, le=1000)  # le: a typo, not a unit (see PowerProfile)

    @field_validator("formats")
    @classmethod
    def _formats(cls, formats: list[str]) -> list[str]:
        if len(set(formats)) != len(formats):
            raise ValueError(f"lists a format twice: {formats}")
        if not {"fp16", "int8"} & set(formats):
            raise ValueError("must include fp16 or int8 (what quantised weights are converted to)")
        return formats

    @field_validator("efficiency")
    @classmethod
    def _increasing(cls, pts: list[EfficiencyPoint]) -> list[EfficiencyPoint]:
        batches = [p.batch for p in pts]
        if batches != sorted(set(batches)):
            raise ValueError(f"efficiency points must have strictly increasing batch, got {batches}")
        return pts


class DramProfile(Strict):
    type: str = documentary("a label", "")
    total_bytes: ByteSize
    usable_bytes: ByteSize  # what one app may hold before the OS kills it
    peak_gbps: float = Field(ge=MIN_RATE)  # theoretical (channels x width x rate)
    # Achieved bandwidth when several agents stream at once (measured, e.g. CPU+NPU).
    combined_gbps: float = Field(ge=MIN_RATE)

    @model_validator(mode="after")
    def _usable_fits(self) -> DramProfile:
        if self.usable_bytes > self.total_bytes:
            raise ValueError(f"usable_bytes {self.usable_bytes / 1e9:.2f} GB must not exceed total_bytes "
                             f"{self.total_bytes / 1e9:.2f} GB")
        if self.combined_gbps > self.peak_gbps:
            raise ValueError(f"combined_gbps {self.combined_gbps} must not exceed peak_gbps {self.peak_gbps}")
        return self


class StorageProfile(Strict):
    type: str = documentary("a label (\"UFS 4.0\", \"NVMe\"); the throughput curves are what is simulated")
    capacity_bytes: ByteSize | None = documentary("the datasheet's figure (the model's image is assumed to "
                                                  "fit)", None)
    page_bytes: ByteSize = 4096  # smallest read; bundles are padded to it
    # Throughput by request size at full queue, sequential and random (random: within
    # a small span; see range_effect).
    seq_read: list[CurvePoint] = Field(min_length=2)
    rand_read: list[CurvePoint] = Field(min_length=2)
    # Random-read throughput relative to rand_read as the span of addresses grows.
    range_effect: list[RangePoint] = Field(default_factory=list)
    queue_depth: int = Field(ge=1, le=1024)
    command_queues: int = Field(ge=1, le=64)  # UFS: 1; NVMe: many
    read_latency_us: float = Field(gt=0)  # one 4 KiB read at queue depth 1
    # Throughput lost when several cores issue reads at once (0.4 = up to 40% lost).
    multi_issuer_penalty: float = Field(ge=0, lt=1)
    active_w: float | None = Field(default=None, gt=0, le=1000)  # le: a typo, not a unit (see PowerProfile)

    _check_seq = field_validator("seq_read")(classmethod(lambda cls, v: _sorted_blocks(v)))
    _check_rand = field_validator("rand_read")(classmethod(lambda cls, v: _sorted_blocks(v)))

    @field_validator("range_effect")
    @classmethod
    def _spans(cls, pts: list[RangePoint]) -> list[RangePoint]:
        spans = [p.span for p in pts]
        if spans != sorted(set(spans)):
            raise ValueError(f"range_effect points must have strictly increasing span, got {spans}")
        return pts


class PowerProfile(Strict):
    # Upper bounds far above any phone or laptop, so a typo (1e308) is refused instead of
    # printing an energy of inf (null in JSON): 1 W per GB/s is 1 nJ per byte (125 pJ/bit),
    # some 50x what DRAM traffic costs.
    idle_w: float = Field(ge=0, le=1000)
    dram_w_per_gbps: float = Field(ge=0, le=1)  # DRAM traffic energy: W per GB/s is J per GB


class DeviceProfile(Strict):
    """One device. ``name`` is how the CLI refers to it."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = documentary("a label", "")
    soc: str = documentary("a label", "")
    kind: Literal["phone", "laptop", "tablet"] = documentary("a label", "phone")
    cpu: CpuProfile
    # Runs what the strategies' prefill_unit / decode_unit knobs put on it; checked against the
    # DRAM figures, so an edit that lowers those may need to lower it too.
    gpu: Accelerator | None = None
    npu: Accelerator | None = None
    dram: DramProfile
    storage: StorageProfile
    power: PowerProfile | None = None

    @model_validator(mode="after")
    def _agents_below_peak(self) -> DeviceProfile:
        for label, agent in (("cpu", self.cpu), ("gpu", self.gpu), ("npu", self.npu)):
            if agent is not None and agent.mem_gbps > self.dram.peak_gbps:
                raise ValueError(f"{label}.mem_gbps {agent.mem_gbps} exceeds dram.peak_gbps "
                                 f"{self.dram.peak_gbps}")
        return self


BUNDLED_DIR = bundled_dir("device_profiles")
