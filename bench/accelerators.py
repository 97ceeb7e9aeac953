"""The accelerators bench/tpu_compile.py compiles for without having one: published chip figures, the
topologies the compilers accept, and how to get their compile-only devices.

Two compilers, one table. TPU: libtpu (`pip install 'jax[tpu]'`) gives the devices of a named slice.
NVIDIA GPU: the CUDA plugin (`pip install 'jax[cuda12]'`, of the installed jax's version) compiles for a
GPU described by a `GpuTargetConfig` text proto (bench/gpu_specs/, from openxla/xla) with `JAX_PLATFORMS=cpu`:
`get_topology_desc(platform="cuda", target_config=..., topology="1x1x8")` gives 8 such GPUs on one host.
"""

from __future__ import annotations

import dataclasses
import pathlib

GIB = 2**30
SPECS = pathlib.Path(__file__).resolve().parent / "gpu_specs"


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published per-chip figures (from `source`, the chip's page): dense bfloat16 FLOP/s, HBM bytes and
    HBM bytes/s, MXUs per chip and the bidirectional chip-to-chip bandwidth (TPU ICI, NVIDIA NVLink)
    in bytes/s, None where no public source gives them. A GPU names its target config (bench/gpu_specs/)."""

    kind: str
    peak_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    source: str
    mxus: int | None = None
    ici_bandwidth: float | None = None
    gpu_spec: str = ""  # bench/gpu_specs/NAME.txtpb: an NVIDIA GPU, compiled by the CUDA plugin
    gpu_estimates: bool = True  # whether the GPU compiler can price its kernels (see `compiler_flags`)

    @property
    def platform(self) -> str:
        return "cuda" if self.gpu_spec else "tpu"

    @property
    def clock_hz(self) -> float | None:
        """The TensorCore clock (cycles/s: the unit of the TPU compiler's `estimated_cycles`), derived from
        the peak (see the note above CHIPS), or None (the GPU compiler estimates times, not cycles)."""
        return self.peak_flops / (self.mxus * _MXU_FLOPS_PER_CYCLE) if self.mxus else None


# The clocks are derived from public figures: peak bfloat16 FLOP/s = clock x MXUs per chip x 16,384
# multiply-accumulates per MXU per cycle x 2 FLOPs ("Each MXU is capable of performing 16K multiply-
# accumulate operations per cycle": https://cloud.google.com/tpu/docs/system-architecture-tpu-vm; MXUs per
# TensorCore and TensorCores per chip: each chip's page). v5e: 197e12 / (1 x 4 x 16384 x 2) = 1.50 GHz;
# v4: 275e12 / (2 x 4 x 16384 x 2) = 1.05 GHz; v5p: 459e12 / (2 x 4 x 16384 x 2) = 1.75 GHz. v6e: its page
# documents two 256 x 256 MXUs per TensorCore, which would give 3.5 GHz; not used until a source states
# the clock, so v6e has no `mxus` and its rows no compiler-estimated time. ICI: "Bidirectional inter-chip
# interconnect (ICI) bandwidth (per chip)" on each chip's page (v4's page gives none).
#
# NVIDIA (the SXM parts, as in 8-GPU servers): the datasheets' dense BF16 Tensor Core figure (they print
# twice it "with sparsity": H100 and H200 1,979 TFLOPS, A100 624), the HBM bandwidth and the NVLink
# bandwidth per GPU (bidirectional: H100/H200 900 GB/s, A100 600 GB/s). HBM bytes: the memory the target
# config says CUDA reports (its `device_memory_size`: 79.1 GiB of an "80GB" H100, 141 GiB of an H200).
_MXU_FLOPS_PER_CYCLE = 16384 * 2
CHIPS = {
    "v4": Chip("TPU v4", 275e12, 32 * GIB, 1200e9, "https://cloud.google.com/tpu/docs/v4", mxus=8),
    "v5e": Chip("TPU v5 lite", 197e12, 16 * GIB, 819e9, "https://cloud.google.com/tpu/docs/v5e", 4, 400e9),
    "v5p": Chip("TPU v5", 459e12, 95 * GIB, 2765e9, "https://cloud.google.com/tpu/docs/v5p", 8, 1200e9),
    "v6e": Chip("TPU v6 lite", 918e12, 32 * GIB, 1638e9, "https://cloud.google.com/tpu/docs/v6e", ici_bandwidth=800e9),
    "h100": Chip(
        "NVIDIA H100 80GB HBM3",
        989.4e12,
        84_942_979_072,
        3.35e12,
        "https://www.nvidia.com/en-us/data-center/h100/",
        ici_bandwidth=900e9,
        gpu_spec="h100_sxm",
    ),
    "h200": Chip(
        "NVIDIA H200 141GB HBM3e",
        989.4e12,
        151_397_597_184,
        4.8e12,
        "https://www.nvidia.com/en-us/data-center/h200/",
        ici_bandwidth=900e9,
        gpu_spec="h200",
    ),
    "a100": Chip(
        "NVIDIA A100-SXM4-80GB",
        312e12,
        85_100_068_864,
        2.039e12,
        "https://www.nvidia.com/en-us/data-center/a100/",
        ici_bandwidth=600e9,
        gpu_spec="a100_sxm_80",
        gpu_estimates=False,
    ),
}

# Our name -> (chip, the compiler's topology name, extra arguments of get_topology_desc). v4 and v5p chips
# have two TensorCores; Cloud TPU VMs drive them as one device ("megacore"), so a v4-8 or v5p-8 is 4
# devices. A GPU topology is hosts x ... x GPUs per host: "1x1x8" is one 8-GPU server (NVLink between all).
TOPOLOGIES = {
    "v5e-1": ("v5e", "v5e:1x1", {"chips_per_host_bounds": [1, 1, 1]}),
    "v6e-1": ("v6e", "v6e:1x1", {"chips_per_host_bounds": [1, 1, 1]}),
    "v5e-8": ("v5e", "v5e:2x4", {}),
    "v6e-8": ("v6e", "v6e:2x4", {}),
    "v4-8": ("v4", "v4:2x2x1", {"chip_config_name": "megacore"}),
    "v5p-8": ("v5p", "v5p:2x2x1", {"chip_config_name": "megacore"}),
    "v5e-32": ("v5e", "v5e:4x8", {}),
    "v5e-64": ("v5e", "v5e:8x8", {}),
    **{f"{gpu}-{n}": (gpu, f"1x1x{n}", {}) for gpu in ("h100", "h200", "a100") for n in (1, 8)},
}

# Fields of the vendored target configs that the CUDA plugin of jax 0.10.2 does not know (its proto is
# older than openxla/xla's files): left out when a config is read, as an older file would lack them.
NEWER_SPEC_FIELDS = ("collective_memory_granularity",)


def chip(topology: str) -> Chip:
    return CHIPS[TOPOLOGIES[topology][0]]


def gpu_target_config(name: str) -> str:
    """bench/gpu_specs/NAME.txtpb as the installed CUDA plugin parses it (`NEWER_SPEC_FIELDS` left out)."""
    lines = (SPECS / f"{name}.txtpb").read_text().splitlines(keepends=True)
    return "".join(line for line in lines if line.split(":")[0].strip() not in NEWER_SPEC_FIELDS)


def devices(topology: str):
    """The compile-only devices of a topology (`TOPOLOGIES`): libtpu's for a TPU, the CUDA plugin's for a GPU."""
    from jax.experimental import topologies

    c = chip(topology)
    _, name, kwargs = TOPOLOGIES[topology]
    if c.gpu_spec:
        config = gpu_target_config(c.gpu_spec)
        return topologies.get_topology_desc(platform="cuda", target_config=config, topology=name).devices
    return topologies.get_topology_desc(topology_name=name, platform="tpu", **kwargs).devices


# The GPU compiler's flags: its per-kernel estimates written into the program (`reification_cost`), and
# which GEMMs it emits. Without a device nothing is autotuned: Triton GEMMs get default tiles (far from
# what a GPU's autotuner picks), so the cuBLAS program (Triton GEMMs off) is the default case and the
# Triton-GEMM program the variant "triton".
# Sorts (the distinct tokens', the sampler's) use XLA's own sort kernel: the CUB radix sort a GPU would
# run sizes its scratch buffer by asking a device, and without one the compile fails ("CUDA Runtime error:
# cudaErrorInvalidDevice: invalid device ordinal", after the kernels are built).
GPU_ESTIMATES = "--xla_gpu_collect_cost_model_stats=true"
CUBLAS_GEMMS = "--xla_gpu_enable_triton_gemm=false"
NO_CUB_SORT = "--xla_gpu_enable_cub_radix_sort=false"


def compiler_flags(topology: str, variant: str) -> list[str]:
    """XLA flags a case's compile runs with (none for a TPU). The CUDA plugin of jax 0.10.2 prices kernels
    from per-architecture tables that it lacks for the A100 (sm_80): there the estimates are not asked for
    (with them the compile fails: "NOT_FOUND: Cannot find key: sm_80")."""
    c = chip(topology)
    if not c.gpu_spec:
        return []
    return [GPU_ESTIMATES] * c.gpu_estimates + [NO_CUB_SORT] + ([] if variant == "triton" else [CUBLAS_GEMMS])


def same_kind(compiled_for: str, running_on: str) -> bool:
    """Whether a device of kind `running_on` is the one a row was compiled for: the same name, or (NVIDIA,
    whose drivers name a part more or less fully) one name the start of the other, word by word: "NVIDIA
    H200" runs the rows of "NVIDIA H200 141GB HBM3e", "NVIDIA H100 PCIe" not those of "NVIDIA H100 80GB HBM3"."""
    a, b = compiled_for.split(), running_on.split()
    n = min(len(a), len(b))
    return a == b or (a[0] == "NVIDIA" and n >= 2 and a[:n] == b[:n])
