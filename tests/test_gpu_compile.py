"""The NVIDIA GPU compiler accepts the project's train step: configs/bilm_small.py's, on one H100 described
by its target config (bench/gpu_specs/), compiled ahead of time by JAX's CUDA plugin on a machine without a
GPU (`jax.experimental.topologies`; nothing is allocated). The compile needs the plugin (`pip install -e
'.[gpu-compile]'`, docs/GPU.md) and is skipped without it, as tests/test_tpu_compile.py is without libtpu;
the checks of bench/accelerators.py's tables and flags around it run everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

from bench import accelerators, tpu_compile

# The CUDA plugin registers its compiler only if it finds a CUDA driver, unless told not to check (or JAX is
# limited to other platforms, which the tests are not): set while this module is collected, before any test
# starts a JAX backend. On a machine without a GPU JAX then runs on the CPU, as without the plugin.
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

VOCAB = 1000


def _spec_field(name: str, field: str) -> float:
    """A field of a vendored target config, read from the file itself."""
    return float(re.search(rf"^\s*{field}: (\S+)$", (accelerators.SPECS / f"{name}.txtpb").read_text(), re.M)[1])


def test_each_gpu_is_judged_against_the_memory_and_bandwidth_its_target_config_describes():
    for key in ("h100", "h200", "a100"):
        chip = accelerators.CHIPS[key]
        assert chip.hbm_bytes == _spec_field(chip.gpu_spec, "device_memory_size")
        # The config's bandwidth is the compiler's cost model's; the datasheet's is within 1% of it.
        assert chip.hbm_bandwidth == pytest.approx(_spec_field(chip.gpu_spec, "memory_bandwidth"), rel=0.01)


def test_a_target_config_is_read_without_the_fields_jax_0_10_2_does_not_know():
    text = accelerators.gpu_target_config("h100_sxm")
    assert "collective_memory_granularity" not in text
    assert "collective_memory_granularity" in (accelerators.SPECS / "h100_sxm.txtpb").read_text()
    assert 'name: "NVIDIA H100 80GB HBM3"' in text and "core_count: 132" in text


def test_gpu_cases_compile_with_the_estimates_and_cublas_or_triton_gemms():
    flags = accelerators.compiler_flags("h100-8", "")
    assert accelerators.GPU_ESTIMATES in flags and accelerators.CUBLAS_GEMMS in flags
    assert accelerators.CUBLAS_GEMMS not in accelerators.compiler_flags("h100-1", "triton")
    assert accelerators.compiler_flags("v5e-8", "") == []
    assert accelerators.GPU_ESTIMATES not in accelerators.compiler_flags("a100-1", "")  # no sm_80 tables
    assert tpu_compile.Case.parse("h200-8/large/bfloat16/8x1/1024").chip.kind == "NVIDIA H200 141GB HBM3e"
    for bad in ("v5e-1/small/bfloat16/1x1/128/triton", "h100-1/small/float32/1x1/128", "h100-2/small/bfloat16/1x1/8"):
        with pytest.raises(ValueError, match="case"):
            tpu_compile.Case.parse(bad)


def test_a_row_runs_on_the_device_kinds_drivers_print_for_its_gpu():
    assert accelerators.same_kind("NVIDIA H200 141GB HBM3e", "NVIDIA H200")
    assert accelerators.same_kind("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")
    assert not accelerators.same_kind("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe")
    assert not accelerators.same_kind("TPU v5 lite", "TPU v5")


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("jax_plugins") is None or importlib.util.find_spec("jax_plugins.xla_cuda12") is None,
    reason="jax's CUDA plugin is not installed (pip install -e '.[gpu-compile]'): this test compiles for an H100",
)
def test_bilm_small_train_step_compiles_for_an_h100():
    """bilm_small's bfloat16 train step, 64 rows, the cuBLAS program with the compiler's estimates: a memory
    plan well inside 80 GB, every LSTM time step's recurrent product a GEMM, kernels the compiler priced."""
    from configs import bilm_small
    from elmo_jax.training import jitted_steps, settings, sharding

    config = bilm_small.get_config()
    config.compute_dtype = "bfloat16"
    cfg = settings.step_config(config, VOCAB)
    (device,) = accelerators.devices("h100-1")
    assert device.device_kind == "NVIDIA H100 80GB HBM3"
    steps = jitted_steps.jit_steps(sharding.make_mesh(1, 1, [device]), cfg, settings.optimizer(config), 64)
    options = {"xla_gpu_collect_cost_model_stats": True, "xla_gpu_enable_triton_gemm": False}
    options["xla_gpu_enable_cub_radix_sort"] = False  # CUB asks a device for its scratch size
    compiled = steps.train.lower(steps.abstract_state, steps.abstract_batch(cfg), 24, None).compile(options)
    memory = compiled.memory_analysis()
    assert 0 < memory.argument_size_in_bytes + memory.temp_size_in_bytes < 8 * 2**30
    text = compiled.as_text()
    assert "__cublas$" in text and '"reification_cost":[{' in text
