"""Parity with AllenNLP's own ELMo code on a tiny random model (tests/fixtures/allennlp_tiny).

The fixture arrays were produced by AllenNLP 2.10.1 (`_ElmoBiLm`, `Elmo`) from the same options and
weights, so every comparison here is against an independent implementation. Fixture activations are
(3, B, T, 32), layer first; `embed` returns (B, 3, T, 32), batch first. Float32 tolerance: 1e-5 absolute.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import elmo_jax

ATOL = 1e-5


def _to_fixture_layout(layers) -> np.ndarray:
    """(B, L, T, D) -> (L, B, T, D), the fixture's layout."""
    return np.asarray(layers).transpose(1, 0, 2, 3)


def assert_layers_match(layers, mask, expected: np.ndarray, expected_mask: np.ndarray) -> None:
    """`layers` (B, L, T, D) equals `expected` (L, B, T, D) within ATOL where a token is, and is exactly
    zero elsewhere; `mask` equals `expected_mask` exactly."""
    mask = np.asarray(mask)
    assert mask.dtype == np.bool_
    np.testing.assert_array_equal(mask, expected_mask)
    got = _to_fixture_layout(layers)
    assert got.shape == expected.shape
    assert got.dtype == np.float32
    np.testing.assert_allclose(got[:, mask], expected[:, expected_mask], atol=ATOL, rtol=0)
    assert np.all(got[:, ~mask] == 0.0), "padding positions must be exact zeros"


def test_batch_to_ids_matches_allennlp(fixture_batch):
    """Our character ids are AllenNLP's `batch_to_ids` output, byte for byte (incl. unicode and
    48/49-byte tokens, literal <S>/</S>, an empty token and an empty sentence)."""
    ids = elmo_jax.batch_to_ids(fixture_batch.sentences)
    ids = np.pad(ids, ((0, 0), (0, fixture_batch.extra_pad), (0, 0)))
    expected = fixture_batch.arrays["char_ids"]
    assert ids.shape == expected.shape
    np.testing.assert_array_equal(ids, expected)


def test_embed_matches_allennlp(tiny_params, fixture_batch):
    """Layers (B, 3, T, 32) and mask match AllenNLP's biLM with boundaries removed."""
    arrays = fixture_batch.arrays
    layers, mask = elmo_jax.embed(tiny_params, arrays["char_ids"])
    B, T, _ = arrays["char_ids"].shape
    assert layers.shape == (B, 3, T, 32)
    assert_layers_match(layers, mask, arrays["activations"], arrays["mask"])


def test_embed_keep_boundaries_matches_allennlp(tiny_params, fixture_batch):
    """With keep_boundaries the <S>/</S> positions are returned as AllenNLP has them before removal."""
    arrays = fixture_batch.arrays
    layers, mask = elmo_jax.embed(tiny_params, arrays["char_ids"], keep_boundaries=True)
    assert_layers_match(layers, mask, arrays["activations_with_bos_eos"], arrays["mask_with_bos_eos"])


def test_embed_carried_state_matches_allennlp_second_call(tiny_params, fixture_batch):
    """Feeding the returned final state into a second call reproduces AllenNLP's stateful second call."""
    arrays = fixture_batch.arrays
    first, first_mask, state = elmo_jax.embed(tiny_params, arrays["char_ids"], return_state=True)
    assert_layers_match(first, first_mask, arrays["activations"], arrays["mask"])
    second, mask = elmo_jax.embed(tiny_params, arrays["char_ids"], initial_state=state)
    assert_layers_match(second, mask, arrays["activations_stateful_2nd_call"], arrays["mask"])


def test_scalar_mix_matches_allennlp_elmo(tiny_params, fixture_batch):
    """`scalar_mix` with the fixture's s and gamma reproduces AllenNLP's `Elmo` output and mask."""
    arrays = fixture_batch.arrays
    layers, mask = elmo_jax.embed(tiny_params, arrays["char_ids"])
    mixed = elmo_jax.scalar_mix(
        layers, jnp.asarray(arrays["scalar_mix_parameters"]), jnp.asarray(arrays["scalar_mix_gamma"]), mask
    )
    np.testing.assert_array_equal(np.asarray(mask), arrays["elmo_mask"])
    np.testing.assert_allclose(np.asarray(mixed), arrays["elmo"], atol=ATOL, rtol=0)


def test_scalar_mix_module_matches_allennlp_elmo(tiny_params, load_batch):
    """The Flax `ScalarMix` initialises s = 0, gamma = 1 (the paper's init) and, with the fixture's
    parameters swapped in, gives AllenNLP's `Elmo` output."""
    arrays = load_batch("main").arrays
    layers, mask = elmo_jax.embed(tiny_params, arrays["char_ids"])
    module = elmo_jax.ScalarMix(num_layers=3)
    variables = module.init(jax.random.key(0), layers, mask)
    params = variables["params"]
    assert set(params) == {"scalar_parameters", "gamma"}
    np.testing.assert_array_equal(np.asarray(params["scalar_parameters"]), np.zeros(3, np.float32))
    np.testing.assert_array_equal(np.asarray(params["gamma"]).reshape(()), np.float32(1.0))

    fixture_params = {
        "scalar_parameters": jnp.asarray(arrays["scalar_mix_parameters"]).reshape(params["scalar_parameters"].shape),
        "gamma": jnp.asarray(arrays["scalar_mix_gamma"]).reshape(np.shape(params["gamma"])),
    }
    mixed = module.apply({"params": fixture_params}, layers, mask)
    np.testing.assert_allclose(np.asarray(mixed), arrays["elmo"], atol=ATOL, rtol=0)


def test_embed_is_stateless(tiny_params, load_batch):
    """Unlike AllenNLP, two calls on the same input give bit-identical output (zero initial state);
    the fixture shows the stateful second call really differs, so this is not vacuous."""
    arrays = load_batch("main").arrays
    first, _ = elmo_jax.embed(tiny_params, arrays["char_ids"])
    second, _ = elmo_jax.embed(tiny_params, arrays["char_ids"])
    np.testing.assert_array_equal(np.asarray(first), np.asarray(second))
    assert np.abs(arrays["activations_stateful_2nd_call"] - arrays["activations"]).max() > 1e-3
    np.testing.assert_allclose(
        _to_fixture_layout(second)[:, arrays["mask"]], arrays["activations"][:, arrays["mask"]], atol=ATOL, rtol=0
    )


def test_unroll_does_not_change_results(tiny_params, load_batch):
    """`unroll` is a speed knob: every unroll factor matches AllenNLP (1e-5); XLA fuses the unrolled
    steps differently, so the factors agree with each other only up to float32 rounding."""
    arrays = load_batch("main").arrays
    for unroll in (1, 4, 25):
        layers, mask = elmo_jax.embed(tiny_params, arrays["char_ids"], unroll=unroll)
        assert_layers_match(layers, mask, arrays["activations"], arrays["mask"])


def test_bfloat16_compute_is_close_to_float32(tiny_params, load_batch):
    """bfloat16 matmuls are a speed option, not a parity one: the result stays float32, zero at padding,
    and close to the float32 result (bf16 has ~3 significant digits)."""
    arrays = load_batch("main").arrays
    reference, _ = elmo_jax.embed(tiny_params, arrays["char_ids"])
    fast, mask = elmo_jax.embed(tiny_params, arrays["char_ids"], compute_dtype="bfloat16")
    np.testing.assert_array_equal(np.asarray(mask), arrays["mask"])
    assert fast.dtype == jnp.float32
    fast, reference = _to_fixture_layout(fast), _to_fixture_layout(reference)
    assert np.all(fast[:, ~arrays["mask"]] == 0.0)
    live_fast, live_ref = fast[:, arrays["mask"]], reference[:, arrays["mask"]]
    assert np.all(np.isfinite(live_fast))
    assert np.abs(live_fast - live_ref).max() < 0.1
    assert np.corrcoef(live_fast.ravel(), live_ref.ravel())[0, 1] > 0.99
    assert not np.array_equal(live_fast, live_ref), "bfloat16 compute should actually change the arithmetic"


def test_embed_under_an_outer_jit_matches_allennlp(tiny_params, load_batch):
    """Inside a user's `jax.jit` the ids are tracers (values unchecked); the result is still AllenNLP's."""
    arrays = load_batch("edge").arrays
    layers, mask = jax.jit(lambda ids: elmo_jax.embed(tiny_params, ids))(jnp.asarray(arrays["char_ids"], jnp.int32))
    assert_layers_match(layers, mask, arrays["activations"], arrays["mask"])
