"""`ElmoTaskLayers`: the frozen biLM + independent scalar mixes as a Flax module of a task model.

References: the paper's formula gamma * sum_j softmax(s)_j * h_j re-derived in NumPy on AllenNLP's own
biLM activations (tests/fixtures/allennlp_tiny), layer norm as AllenNLP computes it (one mean and
variance per layer over unmasked elements, `<S>`/`</S>` included), and AllenNLP's `Elmo` output.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import elmo_jax
from elmo_jax.features.task_layers import BILM_COLLECTION, ElmoTaskLayers, elmo_penalty
from tests.support.compare import assert_trees_equal

ATOL = 1e-5
ONE_TOKEN = np.ones((1, 1, 50), np.int32)  # variables do not depend on the batch: init on the smallest one


def numpy_mix(layers: np.ndarray, mask: np.ndarray, s: np.ndarray, gamma: float, layer_norm: bool) -> np.ndarray:
    """layers (L, B, T2, D) float64, mask (B, T2) -> gamma * sum_j softmax(s)_j * h_j, (B, T, D), boundaries removed."""
    layers = layers.astype(np.float64)
    if layer_norm:
        m = mask[None, :, :, None].astype(np.float64)
        count = m.sum(axis=(1, 2, 3)) * layers.shape[-1]  # (L,)
        mean = (layers * m).sum(axis=(1, 2, 3)) / count
        centred = layers - mean[:, None, None, None]
        variance = ((centred * m) ** 2).sum(axis=(1, 2, 3)) / count
        layers = centred / np.sqrt(variance + 1e-13)[:, None, None, None]
    w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    mixed = gamma * np.einsum("l,lbtd->btd", w, layers)
    lengths = mask.sum(axis=1) - 2
    T = mask.shape[1] - 2
    out = mixed[:, 1 : T + 1]
    return np.where((np.arange(T)[None, :] < lengths[:, None])[..., None], out, 0.0)


def with_mix_params(variables, values):
    """Replaces mix i's s and gamma by values[i] = (s (L,), gamma); the other collections are kept."""
    params = jax.tree.map(lambda x: x, variables["params"])
    for i, (s, gamma) in enumerate(values):
        params["mixes"][f"scalar_mix_{i}"] = {
            "scalar_parameters": jnp.asarray(s, jnp.float32),
            "gamma": jnp.asarray(gamma, jnp.float32),
        }
    return {**variables, "params": params}


@pytest.mark.parametrize("layer_norm", [False, True])
def test_mixes_equal_numpy_formula_on_allennlp_layers(tiny_params, load_batch, layer_norm):
    """Two mixes with their own s and gamma equal the NumPy formula on AllenNLP's activations."""
    for name in ("main", "edge"):
        batch = load_batch(name)
        chars = batch.arrays["char_ids"]
        module = ElmoTaskLayers(bilm=tiny_params, num_output_representations=2, do_layer_norm=layer_norm)
        variables = module.init(jax.random.key(0), ONE_TOKEN)
        values = [(np.array([0.3, -1.2, 0.7]), 1.7), (np.array([-0.5, 0.1, 2.0]), 0.6)]
        reps, mask = jax.jit(module.apply)(with_mix_params(variables, values), chars)
        np.testing.assert_array_equal(np.asarray(mask), batch.arrays["mask"])
        assert len(reps) == 2
        for rep, (s, gamma) in zip(reps, values):
            expected = numpy_mix(
                batch.arrays["activations_with_bos_eos"], batch.arrays["mask_with_bos_eos"], s, gamma, layer_norm
            )
            assert rep.shape == expected.shape and rep.dtype == jnp.float32
            np.testing.assert_allclose(np.asarray(rep), expected, atol=ATOL, rtol=0)
        assert not np.allclose(np.asarray(reps[0]), np.asarray(reps[1]))


def test_equals_allennlp_elmo_output(tiny_params, load_batch):
    """With AllenNLP's fixed mix ([0.25, -0.5, 1.0], gamma 1) the module gives AllenNLP's `Elmo` output."""
    batch = load_batch("main")
    module = ElmoTaskLayers(bilm=tiny_params)
    variables = module.init(jax.random.key(0), ONE_TOKEN)
    fixed = (batch.arrays["scalar_mix_parameters"], batch.arrays["scalar_mix_gamma"][0])
    variables = with_mix_params(variables, [fixed])
    (rep,), mask = module.apply(variables, batch.arrays["char_ids"])
    np.testing.assert_array_equal(np.asarray(mask), batch.arrays["elmo_mask"])
    np.testing.assert_allclose(np.asarray(rep), batch.arrays["elmo"], atol=ATOL, rtol=0)


def _loss(reps, mask):
    weights = jnp.linspace(-1.0, 1.0, reps[0].shape[-1])[None, None, :]
    return sum(jnp.sum(jnp.where(mask[..., None], r * weights, 0.0) ** 2) for r in reps)


def test_frozen_bilm_gets_exactly_zero_gradient_and_finetuned_gets_one(tiny_params, load_batch):
    chars = load_batch("main").arrays["char_ids"]
    frozen = ElmoTaskLayers(bilm=tiny_params, num_output_representations=2)
    variables = frozen.init(jax.random.key(0), ONE_TOKEN)
    assert set(variables["params"]) == {"mixes"}, "a frozen biLM must not be a trainable variable"
    assert set(variables) == {"params", "bilm"}
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
        variables["bilm"]["weights"],
        tiny_params.weights,
    )

    grads = jax.jit(jax.grad(lambda v: _loss(*frozen.apply(v, chars))))(variables)
    assert all(np.all(np.asarray(g) == 0.0) for g in jax.tree.leaves(grads["bilm"]))
    assert all(np.any(np.asarray(g) != 0.0) for g in jax.tree.leaves(grads["params"]))

    tuned = ElmoTaskLayers(bilm=tiny_params, num_output_representations=2, finetune_bilm=True)
    variables = tuned.init(jax.random.key(0), ONE_TOKEN)
    assert set(variables["params"]) == {"mixes", "bilm"}
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
        variables["params"]["bilm"],
        tiny_params.weights,
    )
    grads = jax.jit(jax.grad(lambda v: _loss(*tuned.apply(v, chars))))(variables)["params"]["bilm"]
    for group in ("char_embed", "CNN", "CNN_high_0", "CNN_proj", "RNN_0", "RNN_1"):
        assert any(np.any(np.asarray(g) != 0.0) for g in jax.tree.leaves(grads[group])), group
    # Same outputs as frozen before any update.
    tuned_out = jax.jit(tuned.apply)(variables, chars)[0][1]
    frozen_vars = {"params": {"mixes": variables["params"]["mixes"]}, "bilm": {"weights": tiny_params.weights}}
    frozen_out = jax.jit(frozen.apply)(frozen_vars, chars)[0][1]
    np.testing.assert_array_equal(np.asarray(tuned_out), np.asarray(frozen_out))


def test_mixes_have_separate_parameters(tiny_params, load_batch):
    """A loss on mix 0 only moves mix 0's s and gamma."""
    chars = load_batch("edge").arrays["char_ids"]
    module = ElmoTaskLayers(bilm=tiny_params, num_output_representations=3)
    variables = module.init(jax.random.key(0), ONE_TOKEN)
    assert set(variables["params"]["mixes"]) == {"scalar_mix_0", "scalar_mix_1", "scalar_mix_2"}

    def loss_of_first(v):
        reps, mask = module.apply(v, chars)
        return _loss(reps[:1], mask)

    grads = jax.jit(jax.grad(loss_of_first))(variables)
    mixes = grads["params"]["mixes"]
    assert np.any(np.asarray(mixes["scalar_mix_0"]["scalar_parameters"]) != 0.0)
    assert np.asarray(mixes["scalar_mix_0"]["gamma"]) != 0.0
    for other in ("scalar_mix_1", "scalar_mix_2"):
        assert all(np.all(np.asarray(g) == 0.0) for g in jax.tree.leaves(mixes[other]))


def test_jit_dropout_and_l2_penalty(tiny_params, load_batch):
    chars = load_batch("main").arrays["char_ids"]
    module = ElmoTaskLayers(bilm=tiny_params, num_output_representations=2, dropout=0.5, l2_coef=0.01)
    params = module.init(jax.random.key(0), ONE_TOKEN)
    params = with_mix_params(params, [(np.array([1.0, 2.0, -3.0]), 1.0), (np.array([0.5, 0.0, 0.0]), 2.0)])
    eager, mask = module.apply(params, chars)
    jitted, jmask = jax.jit(lambda v, c: module.apply(v, c))(params, chars)
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=ATOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(mask), np.asarray(jmask))

    (dropped, _), state = jax.jit(
        lambda v, c, k: module.apply(v, c, deterministic=False, rngs={"dropout": k}, mutable=["losses"])
    )(params, chars, jax.random.key(1))
    # 0.01 * (1 + 4 + 9) + 0.01 * 0.25, by hand
    np.testing.assert_allclose(float(elmo_penalty(state)), 0.1425, rtol=1e-6)
    for kept, full in zip(dropped, eager):
        kept, full = np.asarray(kept), np.asarray(full)
        live = np.asarray(mask)[..., None] & (full != 0.0)
        zeroed = live & (kept == 0.0)
        assert 0.35 < zeroed.sum() / live.sum() < 0.65
        np.testing.assert_allclose(kept[live & ~zeroed] / 2.0, full[live & ~zeroed], atol=ATOL, rtol=0)
    assert float(elmo_penalty({})) == 0.0


class Tagger(nn.Module):
    """A user's model: word embeddings concatenated with ELMo, a dense layer per token."""

    bilm: elmo_jax.BiLMParams
    n_words: int = 50
    n_tags: int = 3

    @nn.compact
    def __call__(self, word_ids, chars, *, deterministic=True):
        (elmo,), mask = ElmoTaskLayers(bilm=self.bilm, dropout=0.1, l2_coef=0.001)(chars, deterministic=deterministic)
        x = jnp.concatenate([nn.Embed(self.n_words, 8)(word_ids), elmo], axis=-1)
        return nn.Dense(self.n_tags)(x), mask


def test_inside_a_user_model_trains_under_jit(tiny_params, load_batch):
    batch = load_batch("main")
    chars = batch.arrays["char_ids"]
    mask = batch.arrays["mask"]
    rng = np.random.default_rng(0)
    word_ids = rng.integers(0, 50, mask.shape).astype(np.int32)
    tags = rng.integers(0, 3, mask.shape).astype(np.int32)
    model = Tagger(bilm=tiny_params)
    variables = model.init(jax.random.key(0), word_ids[:1, :1], ONE_TOKEN)
    params, frozen = variables["params"], {"bilm": variables["bilm"]}
    assert "bilm" not in jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(params)[0])
    optimizer = optax.adam(0.05)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, key):
        def loss_fn(p):
            (logits, m), state = model.apply(
                {"params": p, **frozen}, word_ids, chars, deterministic=False, rngs={"dropout": key}, mutable=["losses"]
            )
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, tags)
            return jnp.sum(jnp.where(m, ce, 0.0)) / jnp.sum(m) + elmo_penalty(state)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for i in range(30):
        params, opt_state, loss = step(params, opt_state, jax.random.key(i))
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    assert np.any(np.asarray(params["ElmoTaskLayers_0"]["mixes"]["scalar_mix_0"]["scalar_parameters"]) != 0.0)


def test_bad_input_is_refused(tiny_params):
    module = ElmoTaskLayers(bilm=tiny_params)
    with pytest.raises(ValueError, match=r"chars: expected shape \(batch, tokens, 50\), found \(2, 3\)"):
        module.init(jax.random.key(0), np.ones((2, 3), np.int32))
    with pytest.raises(ValueError, match=r"chars: ids must be in \[0, 262\)"):
        module.init(jax.random.key(0), np.full((1, 2, 50), 300, np.int32))
    with pytest.raises(ValueError, match="ElmoTaskLayers.bilm must be BiLMParams"):
        ElmoTaskLayers(bilm=tiny_params.weights).init(jax.random.key(0), np.ones((1, 2, 50), np.int32))
    with pytest.raises(ValueError, match="num_output_representations must be a positive integer, found 0"):
        ElmoTaskLayers(bilm=tiny_params, num_output_representations=0).init(
            jax.random.key(0), np.ones((1, 2, 50), np.int32)
        )


def test_variables_without_the_bilm_collection_are_refused(tiny_params):
    module = ElmoTaskLayers(bilm=tiny_params)
    variables = module.init(jax.random.key(0), ONE_TOKEN)
    with pytest.raises(ValueError, match="no 'bilm' collection"):
        module.apply({"params": variables["params"]}, ONE_TOKEN)


def test_a_jitted_task_step_holds_no_weight_constants():
    """The small model's weights (~13M floats) would be ~104 MB of program text as constants (measured
    before the weights became a variable collection: 108,843,077 characters); as arguments the lowered
    step of a two-mix task loss is ~0.3 MB."""
    config = elmo_jax.BiLMConfig.preset("small")
    shapes = jax.eval_shape(lambda: elmo_jax.init_params(config, jax.random.key(0)).weights)
    rng = np.random.default_rng(0)  # not zeros: a constant of equal values would print as one number
    bilm = elmo_jax.BiLMParams(jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32), shapes), config)
    module = ElmoTaskLayers(bilm=bilm, num_output_representations=2)
    chars = np.asarray(elmo_jax.batch_to_ids([["a", "b", "c"], ["d"]]))
    variables = jax.eval_shape(lambda: module.init(jax.random.key(0), chars))
    step = jax.jit(jax.grad(lambda v, c: _loss(*module.apply(v, c))))
    text = step.lower(variables, chars).as_text()
    assert len(text) < 1_000_000, f"{len(text):,} characters of lowered program"


def test_init_traces_the_bilm_for_shapes_and_never_runs_it(tiny_params, monkeypatch):
    """Issue #33: `init` ran the biLM eagerly, op by op (about 30 s for the small model), though the
    mixes' parameters depend on the layers' shapes only. Now `init` traces it (`jax.eval_shape`) and
    `apply` runs it; the variables are the same."""
    from elmo_jax.features import task_layers

    calls = []
    real = task_layers.bilm_layers

    def spy(params, chars, *args, **kwargs):
        calls.append("traced" if isinstance(chars, jax.core.Tracer) else "run")
        return real(params, chars, *args, **kwargs)

    monkeypatch.setattr(task_layers, "bilm_layers", spy)
    module = ElmoTaskLayers(bilm=tiny_params, num_output_representations=2, do_layer_norm=True)
    variables = module.init(jax.random.key(0), ONE_TOKEN)
    assert calls == ["traced"]
    assert_trees_equal(variables[BILM_COLLECTION]["weights"], tiny_params.weights)
    for mix in ("scalar_mix_0", "scalar_mix_1"):
        mixed = variables["params"]["mixes"][mix]
        np.testing.assert_array_equal(np.asarray(mixed["scalar_parameters"]), np.zeros(3, np.float32))
        np.testing.assert_array_equal(np.asarray(mixed["gamma"]), np.ones((), np.float32))
    (reps, mask) = module.apply(variables, ONE_TOKEN)
    assert calls == ["traced", "run"] and len(reps) == 2 and np.asarray(mask).all()
