"""Heldout perplexity with the full softmax, as bilm-tf reports it: one in-order pass over a corpus, each
of the batch's rows reading its share of the sentences from a zero LSTM state carried across windows
(or, with `from_zero_state`, every sentence from a zero state, as `embed` reads it).
Used during training (on the training mesh) and by `python -m elmo_jax.evaluate` (on one device).
Beside it, the perplexity of a unigram model of the training text (`unigram_perplexity`), the scale
the biLM's is read against.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from absl import logging

from elmo_jax.data.batch_stream import BiLMBatchStream
from elmo_jax.formats.vocab_file import EOS, Vocab
from elmo_jax.model.lstm import zero_state
from elmo_jax.model.vocabulary import pad_id
from elmo_jax.runtime import processes
from elmo_jax.runtime.progress import Progress
from elmo_jax.training import sharding
from elmo_jax.training.batch_feed import device_batch
from elmo_jax.training.jitted_steps import Steps
from elmo_jax.training.train_step import StepConfig, eval_step

PROGRESS_EVERY_S = 30.0  # a line this often while an evaluation runs


def heldout_perplexity(
    params: dict,
    cfg: StepConfig,
    sentences: Sequence[str],
    vocab: Vocab,
    batch_size: int,
    max_batches: int = 0,
    *,
    steps: Steps | None = None,
    from_zero_state: bool = False,
    on_window: Callable[[int, float], None] | None = None,
) -> dict[str, float]:
    """Full-softmax perplexities over a heldout corpus.

    Args:
      params: `TrainState.params` ({"bilm", "softmax"}).
      cfg: the steps' static settings (its vocabulary size must be `vocab`'s).
      sentences: random-access sentences (text, tokens separated by spaces).
      vocab: the training vocabulary.
      batch_size: rows per window.
      max_batches: stop after this many windows (0: the whole corpus).
      steps: the jitted steps of the training mesh (params sharded as they say; with several processes
        each feeds its own rows); None runs on the device `params` are on.
      from_zero_state: read every sentence from a zero LSTM state, as `embed` does, instead of the
        state the row carries from its previous sentences (bilm-tf's evaluation).
      on_window: called after each window with its char CNN width bucket and its seconds (the first of a
        width compiles the eval step for it): how the training ETA learns what an evaluation costs.

    Returns: forward_perplexity, backward_perplexity, perplexity (exp of the mean of the two
    cross-entropies), cross_entropy, and tokens (targets scored per direction).
    """
    if steps is not None and steps.batch_size != batch_size:
        raise ValueError(
            f"heldout_perplexity: batch_size {batch_size} differs from the {steps.batch_size} rows the "
            "steps were built for"
        )
    stream = heldout_stream(sentences, vocab, cfg, batch_size, steps, from_zero_state)
    sums, counts = _summed_cross_entropies(params, cfg, stream, batch_size, max_batches, steps, on_window)
    return _perplexities(sums, counts)


def heldout_stream(
    sentences: Sequence[str],
    vocab: Vocab,
    cfg: StepConfig,
    batch_size: int,
    steps: Steps | None = None,
    from_zero_state: bool = False,
) -> BiLMBatchStream:
    """One in-order pass over `sentences`, this process's block of the `batch_size` rows (all of them
    with `steps` None)."""
    block, blocks = sharding.process_rows(steps.batch, batch_size) if steps is not None else (0, 1)
    return BiLMBatchStream(
        sentences,
        vocab,
        batch_size=batch_size,
        unroll_steps=cfg.unroll_steps,
        seed=None,
        repeat=False,
        process_index=block,
        process_count=blocks,
        max_characters_per_token=cfg.model.max_characters_per_token,
        reset_probability=1.0 if from_zero_state else 0.0,
        vocabulary=cfg.vocabulary,
    )


def _summed_cross_entropies(
    params: dict,
    cfg: StepConfig,
    stream: BiLMBatchStream,
    batch_size: int,
    max_batches: int,
    steps: Steps | None,
    on_window: Callable[[int, float], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(summed cross-entropies, targets scored) per direction over the stream's windows: [2] float64 each;
    `on_window(width, seconds)` after each window (`heldout_perplexity`)."""
    lstm = zero_state(cfg.model, batch_size) if steps is None else steps.zero_lstm()
    several = jax.process_count() > 1
    sums, counts = np.zeros(2), np.zeros(2)
    progress = Progress({"windows": max_batches or None}, every_s=PROGRESS_EVERY_S, log=True)
    for i in itertools.count():
        started = time.perf_counter()
        window = next(stream, None)
        if (max_batches and i >= max_batches) or (window is None and not several):
            break
        if progress.due():  # a long evaluation says how far it is
            of = f" of at most {max_batches:,}" if max_batches else ""
            progress.write(
                f"evaluating heldout: {i:,} windows{of}, {int(counts[0]):,} tokens scored so far, "
                f"{progress.seconds():.0f} s"
            )
        # Every process takes part in every step: one whose rows are done feeds empty windows until
        # no process has tokens left.
        window = window or stream.empty_window()
        batch, positions = device_batch(window, cfg.model.max_characters_per_token, pad_id(cfg.model))
        if steps is None:
            s, c, lstm = eval_step(params, lstm, batch, cfg=cfg, content_positions=positions)
        else:
            global_batch = processes.global_batch(batch, steps.batch, batch_size)
            positions = processes.agree_max(positions)
            s, c, lstm = steps.eval(params, lstm, global_batch, positions)
        c = np.asarray(c, np.float64)  # waits for the window: its seconds are its own
        if on_window is not None:
            on_window(positions, time.perf_counter() - started)
        if several and not c.any():
            break
        sums += np.asarray(s, np.float64)
        counts += c
    return sums, counts


def _perplexities(sums: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """`heldout_perplexity`'s dict from the summed cross-entropies and target counts ([2]: forward, backward)."""
    ce = sums / np.maximum(counts, 1.0)
    return {
        "forward_perplexity": float(np.exp(ce[0])),
        "backward_perplexity": float(np.exp(ce[1])),
        "perplexity": float(np.exp(ce.mean())),
        "cross_entropy": float(ce.mean()),
        "tokens": float(counts[0]),
    }


def heldout_windows(sentences: Sequence[str], batch_size: int, unroll_steps: int, max_batches: int = 0) -> int:
    """About how many windows an evaluation reads, for the training ETA before one ran: the targets
    (each sentence's words and its </S>) over the batch_size x unroll_steps a window holds, the sentences'
    length taken from an even sample of at most 1,000; at most `max_batches` (0: no cap). The rows' shares
    end unevenly, so a pass reads a few more (the demo: 28 estimated, 32 read)."""
    n = len(sentences)
    if not n:
        return 0
    sample = range(0, n, max(1, n // 1000))
    targets = n * sum(len(sentences[i].split()) + 1 for i in sample) / len(sample)
    windows = math.ceil(targets / (batch_size * unroll_steps))
    return min(windows, max_batches) if max_batches else windows


# The unigram model's pass at the first evaluation (`unigram_counts`, `unigram_perplexity`), per sentence
# read: the demo's 19,780 training and 1,078 heldout sentences took 0.95 s on a 2-core CPU.
UNIGRAM_S_PER_SENTENCE = 45e-6


def unigram_seconds(train: Sequence[str], heldout: Sequence[str]) -> float:
    """About the seconds the unigram model's pass takes (what the first evaluation spends beside its
    windows), for the training ETA."""
    return UNIGRAM_S_PER_SENTENCE * (min(len(train), UNIGRAM_MAX_SENTENCES) + len(heldout))


UNIGRAM_MAX_SENTENCES = 200_000  # a larger corpus is sampled evenly: the counts settle long before


def unigram_counts(train: Sequence[str], vocab: Vocab, max_sentences: int = UNIGRAM_MAX_SENTENCES) -> np.ndarray:
    """int64 (V,) counts of each vocabulary id over the training sentences (or an even sample of
    `max_sentences` of them): their words (unknown ones as <UNK>) and one </S> per sentence, the targets
    the forward LM predicts (the backward one's have the same distribution, <S> for </S>)."""
    counts = np.zeros(len(vocab), np.int64)
    for i in range(0, len(train), max(1, len(train) // max_sentences)):
        np.add.at(counts, vocab.encode(train[i].split()), 1)
        counts[vocab.eos_id] += 1
    return counts


def unigram_perplexity(counts: np.ndarray, heldout: Sequence[str], vocab: Vocab, max_tokens: int = 0) -> float:
    """The heldout perplexity of the add-one-smoothed unigram model of `counts` (`unigram_counts`): what
    a model that ignores context scores, the scale a biLM's perplexity is read against. Over the heldout
    sentences in order, the first ones holding `max_tokens` targets when it is given (an evaluation capped
    by eval_max_batches scores about that many)."""
    log_p = np.log((counts + 1) / (counts.sum() + len(vocab)))
    nll, n = 0.0, 0
    for i in range(len(heldout)):
        ids = vocab.encode([*heldout[i].split(), EOS])
        nll -= float(log_p[ids].sum())
        n += len(ids)
        if max_tokens and n >= max_tokens:
            break
    return math.exp(nll / max(n, 1))


def warn_if_worse_than_uniform(result: dict[str, float], vocab_size: int) -> list[str]:
    """Logs (and returns) a warning for each direction whose heldout perplexity exceeds `vocab_size`.

    A perplexity above V is worse than guessing uniformly among the V words. The sampled softmax lets a
    model get there while its training loss looks normal: rows of words it rarely draws as candidates are
    never pushed down, and when one direction's LSTM outputs saturate, those words outscore the right
    ones almost everywhere. Measured on the demo model (bench/RESULTS.md, "State resets"): every seed
    trained without state resets did this in one direction or the other, some recovering later; none with
    5% resets.

    Args:
      result: `heldout_perplexity`'s dict (forward_perplexity, backward_perplexity).
      vocab_size: V, the training vocabulary's size.
    """
    warnings = []
    for direction in ("forward", "backward"):
        perplexity = result.get(f"{direction}_perplexity", 0.0)
        if perplexity > vocab_size:
            warnings.append(
                f"heldout {direction} perplexity {perplexity:.4g} is worse than a uniform guess among the "
                f"{vocab_size} words: its sampled-softmax training loss does not show this, because words "
                "the sampler rarely draws now outscore the right ones (seen in small models trained with "
                "state_reset_probability=0; longer training can recover, or train with resets, see "
                "configs/default.py)"
            )
            logging.warning("%s", warnings[-1])
    return warnings
