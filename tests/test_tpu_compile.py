"""The TPU compiler accepts the project's programs: the tiny config's train step on a 4 x 2 mesh and the
feature extractor (`embed_file`'s program) on eight chips of a v5e:2x4 topology, compiled ahead of time
by libtpu's compiler on a machine without a TPU (`jax.experimental.topologies`; nothing is allocated).

This needs libtpu (`pip install "jax[tpu]"`); without it the module is skipped with that reason. The
test extra does not install it: see docs/TPU.md ("The TPU compiler without a TPU") for the measured cost.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip(
    "libtpu", reason="libtpu is not installed (pip install 'jax[tpu]'): these tests compile for a TPU topology"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import topologies  # noqa: E402

from configs import tiny  # noqa: E402
from elmo_jax.features import batch_runner  # noqa: E402
from elmo_jax.model.distinct_tokens import rounded_slots  # noqa: E402
from elmo_jax.model.precision import ComputeOptions  # noqa: E402
from elmo_jax.training import jitted_steps, settings, sharding  # noqa: E402

VOCAB = 1000


@pytest.fixture(scope="module")
def v5e_8():
    """The eight compile-only devices of a TPU v5e 2x4 slice."""
    # No TPU is opened: libtpu's one-process-per-host lock is not needed (test workers run side by side).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    devices = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices
    assert len(devices) == 8 and devices[0].device_kind == "TPU v5 lite"
    return devices


def test_the_train_step_compiles_for_a_v5e_2x4_slice(v5e_8):
    """configs/tiny.py's train step, sampled softmax with the sparse row update, mesh 4 (data) x 2 (model),
    the char CNN over half of each chip's tokens as distinct ones (as the trainer runs it by default)."""
    config = tiny.get_config()
    config.compute_dtype = "bfloat16"
    cfg = settings.step_config(config, VOCAB)
    mesh = sharding.make_mesh(4, 2, v5e_8)
    steps = jitted_steps.jit_steps(mesh, cfg, settings.optimizer(config), config.batch_size)
    batch = steps.abstract_batch(cfg)
    per_chip = 2 * config.batch_size * config.unroll_steps // 4
    slots = rounded_slots(per_chip // 2, per_chip)
    assert slots is not None
    compiled = steps.train.lower(steps.abstract_state, batch, 8, slots).compile()
    memory = compiled.memory_analysis()
    assert 0 < memory.argument_size_in_bytes < 2**30 and memory.temp_size_in_bytes < 2**30
    assert "all-reduce" in compiled.as_text()  # the data axis sums the gradients


def test_the_extractor_compiles_for_a_v5e_2x4_slice(v5e_8):
    """`embed_file`'s char program (every layer, float32 out) for the tiny biLM, 8 rows per chip."""
    config = settings.model_config(tiny.get_config())
    mesh = batch_runner.device_mesh(v5e_8)
    rows, replicated = jax.NamedSharding(mesh, jax.P(batch_runner.AXIS)), jax.NamedSharding(mesh, jax.P())
    from elmo_jax.model.params import init_params

    weights = jax.eval_shape(lambda: init_params(config, jax.random.key(0)).weights)
    weights = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), weights)
    chars = jax.ShapeDtypeStruct((64, 12, config.max_characters_per_token), jnp.int32, sharding=rows)
    mix = jax.ShapeDtypeStruct((config.n_output_layers,), jnp.float32, sharding=replicated)
    program = batch_runner._chars_program(mesh, "all", "float32")
    lowered = program.lower(config, ComputeOptions(dtype="bfloat16", content_positions=8), weights, chars, mix)
    compiled = lowered.compile()
    assert compiled.memory_analysis().argument_size_in_bytes > 0
    assert "all-gather" not in compiled.as_text()  # each chip embeds its own rows
