"""ELMo as a layer of a task model: character ids in, `num_output_representations` learned mixes out.

    elmo = ElmoTaskLayers(bilm=elmo_jax.load_hdf5(options, weights), num_output_representations=2,
                          dropout=0.5, l2_coef=0.001)
    variables = elmo.init(key, chars)     # {"params": the mixes' s and gamma, "bilm": the frozen weights}
    (reps, mask), state = elmo.apply(variables, chars, deterministic=False, rngs={"dropout": k},
                                     mutable=["losses"])
    loss = task_loss(reps, ...) + elmo_penalty(state)       # reps: list of (B, T, 2P); mask (B, T)

The frozen biLM's weights live in their own variable collection, "bilm" (`BILM_COLLECTION`), next to
"params": `init` fills it from `bilm`, and `apply` reads it from the variables it is given, so under
`jax.jit` the weights are arguments of the compiled program, never constants baked into it (as a static
module attribute they were, which put the weights into the program text of every compile of a task
step; measured: bench/RESULTS.md, "Design figures"). The optimiser is given "params" only, and the
weights sit behind `jax.lax.stop_gradient` as well, so their gradient is exactly zero (the paper's
recipe: the biLM is frozen, only s and gamma are learned). Pass the whole `variables` (or
`{"params": p, "bilm": variables["bilm"]}`) to `apply`. `finetune_bilm=True` instead makes the weights a
Flax parameter ("params"/"bilm", initialised from the given ones), so they train with the task
(AllenNLP's `requires_grad`).

The mixes are taken with `<S>`/`</S>` present and the boundaries removed afterwards, as AllenNLP's
`Elmo` does, so layer normalisation sees the same elements (one mean and variance per layer over all
unmasked positions, boundaries included).

Initialising (`init`, also of a task model holding this module) does not run the biLM: its layers are
taken as zeros of their shapes (`jax.eval_shape`), since no parameter depends on their values; so the
outputs of `init_with_output` are zeros, and `apply` computes the real ones.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from elmo_jax.features.embed import check_char_ids
from elmo_jax.features.mix import ElmoRepresentations
from elmo_jax.model.bilm import bilm_layers, remove_boundaries, token_mask
from elmo_jax.model.lstm import zero_state
from elmo_jax.model.params import BiLMParams
from elmo_jax.model.precision import ComputeOptions

BILM_COLLECTION = "bilm"  # the variable collection of the frozen biLM's weights


class ElmoTaskLayers(nn.Module):
    """A frozen (or fine-tuned) biLM followed by independent scalar mixes of its layers.

    Attributes:
      bilm: the biLM (`load_hdf5`, `init_params`, `load`): its config, and the weights `init` puts into
        the "bilm" collection (or into "params" with `finetune_bilm`); `apply` uses the variables' copy.
      num_output_representations: how many independent mixes (2 in the paper for SQuAD/SNLI: at the
        input and the output of the task RNN).
      do_layer_norm: normalise each layer before mixing (AllenNLP's statistics).
      dropout: dropout rate on each mix (needs a "dropout" rng when not deterministic).
      l2_coef: lambda of `lambda * ||s||^2` per mix, sown into the "losses" collection (see `elmo_penalty`).
      finetune_bilm: train the biLM weights too, as a Flax parameter "bilm" initialised from `bilm`.
      compute_dtype: "float32" or "bfloat16" matrix products in the biLM.
    """

    bilm: BiLMParams
    num_output_representations: int = 1
    do_layer_norm: bool = False
    dropout: float = 0.0
    l2_coef: float = 0.0
    finetune_bilm: bool = False
    compute_dtype: str = "float32"

    @nn.compact
    def __call__(self, char_ids: jax.Array, *, deterministic: bool = True) -> tuple[list[jax.Array], jax.Array]:
        """Shifted character ids int (B, T, C) from `batch_to_ids` -> ([(B, T, 2P)] * n, bool mask (B, T)).

        Representations are exact zeros at padding. Ids are checked on the host when concrete (outside
        jit); under jit only their shape and dtype can be.
        """
        if not isinstance(self.bilm, BiLMParams):
            raise ValueError(
                f"ElmoTaskLayers.bilm must be BiLMParams (from load_hdf5, init_params or load), "
                f"found {type(self.bilm).__name__}"
            )
        if not isinstance(self.num_output_representations, int) or self.num_output_representations < 1:
            raise ValueError(
                f"ElmoTaskLayers.num_output_representations must be a positive integer, found "
                f"{self.num_output_representations!r}"
            )
        config = self.bilm.config
        chars = check_char_ids(char_ids, config)
        weights = self._weights()

        def run_bilm(weights, chars):
            layers, mask, _ = bilm_layers(
                BiLMParams(weights, config),
                chars,
                zero_state(config, chars.shape[0]),
                compute=ComputeOptions(dtype=self.compute_dtype),
            )
            return layers, mask

        if self.is_initializing():
            # Initialisation needs only the shapes: the mixes' parameters do not depend on the layers'
            # values. Running the biLM here (eagerly, op by op) took ~30 s for the small model.
            layers, mask = (jnp.zeros(x.shape, x.dtype) for x in jax.eval_shape(run_bilm, weights, chars))
        else:
            layers, mask = run_bilm(weights, chars)
        mixes = ElmoRepresentations(
            num_output_representations=self.num_output_representations,
            num_layers=config.n_output_layers,
            layer_norm=self.do_layer_norm,
            dropout=self.dropout,
            l2_coef=self.l2_coef,
            name="mixes",
        )(layers, mask, deterministic=deterministic)
        outputs = [remove_boundaries(mix, mask)[0] for mix in mixes]  # (B, T2, 2P) -> (B, T, 2P)
        return outputs, token_mask(chars)

    def _weights(self) -> Any:
        def initial(*_):
            return jax.tree.map(jnp.asarray, self.bilm.weights)

        if self.finetune_bilm:
            return self.param("bilm", initial)
        if not self.is_initializing() and not self.has_variable(BILM_COLLECTION, "weights"):
            raise ValueError(
                f"ElmoTaskLayers: the variables passed to apply have no {BILM_COLLECTION!r} collection (the frozen "
                f"biLM's weights); pass everything init returned, e.g. {{'params': params, '{BILM_COLLECTION}': "
                f"variables['{BILM_COLLECTION}']}}"
            )
        return jax.lax.stop_gradient(self.variable(BILM_COLLECTION, "weights", initial).value)


def elmo_penalty(state: Any) -> jax.Array:
    """The sum of every L2 term sown into the "losses" collection (the mixes' `lambda * ||s||^2`).

    Args:
      state: the mutated variables returned by `apply(..., mutable=["losses"])` (a dict with a "losses"
        entry, or the "losses" collection itself); may hold other modules' losses, which are summed too.

    Returns:
      float32 scalar, 0.0 when nothing was sown (l2_coef == 0).
    """
    losses = state.get("losses", state) if hasattr(state, "get") else state
    leaves = jax.tree.leaves(losses)
    return sum((jnp.sum(leaf) for leaf in leaves), jnp.zeros((), jnp.float32))
