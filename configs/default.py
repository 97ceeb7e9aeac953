"""Default training config: every key, with what it means. Presets import this and override a few keys.

    python train.py --config=configs/default.py --workdir=/tmp/elmo --config.num_train_steps=1000

Durations are in steps. Derived values (per-process batch, vocabulary size, parameter counts, ...) are
computed in code and logged, and the resolved config is saved with every checkpoint.
"""

import dataclasses

import ml_collections

from elmo_jax.model.config import PUBLISHED_FILTERS, BiLMConfig


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # parameters, dropout, candidate sampling and the data shuffle all derive from it

    # The biLM architecture (the options JSON's `lstm` and `char_cnn` sections).
    config.model = ml_collections.ConfigDict()
    config.model.char_embed_dim = 16  # E: character embedding width
    config.model.filters = PUBLISHED_FILTERS  # ((width, n_filters), ...); --config.model.filters='((1,4),(2,8))'
    config.model.n_highway = 2  # highway layers after the convolutions
    config.model.activation = "relu"  # after max-pooling each convolution: relu or tanh
    config.model.max_characters_per_token = 50  # C: BOW + up to C-2 UTF-8 bytes + EOW
    config.model.lstm_dim = 4096  # H: LSTM cell size
    config.model.projection_dim = 512  # P: LSTM output and token embedding width
    config.model.n_layers = 2  # LSTM layers per direction
    config.model.cell_clip = 3.0  # clip of the cell state
    config.model.proj_clip = 3.0  # clip of the projected output
    config.model.use_skip_connections = True  # residual around every LSTM layer but the first

    # The corpus: local text files (one tokenized sentence per line), a TFDS dataset by name, or, with
    # neither, the embedded default corpus built from the Python standard library's docstrings.
    config.data = ml_collections.ConfigDict()
    config.data.train_files = ""  # glob of training text files
    config.data.heldout_files = ""  # glob of held-out text files (evaluation)
    config.data.tfds_name = ""  # e.g. "lm1b": a prepared TFDS dataset with a "text" feature
    config.data.tfds_data_dir = ""  # TFDS data_dir ("" = TFDS's default)
    config.data.tfds_train_split = "train"
    config.data.tfds_heldout_split = "test"
    config.data.vocab_file = ""  # bilm-tf vocab file; "" = build one from the training text into WORKDIR
    config.data.min_count = 1  # when building the vocab: drop rarer words
    config.data.max_vocab_size = 0  # when building the vocab: keep at most this many entries (0 = all)
    # What the char CNN reads: "bytes" (bilm-tf, AllenNLP: UTF-8 bytes, 261 ids) or "corpus" (the model's own
    # characters, counted from the training text into WORKDIR/characters.json: one id per character, so
    # model.max_characters_per_token counts characters; for Chinese, Japanese, ... docs/SEGMENTATION.md).
    config.data.characters = "bytes"
    config.data.max_line_chars = 100_000  # longer lines are skipped and counted
    config.data.invalid_utf8 = "replace"  # lines with invalid UTF-8: "replace" (U+FFFD) or "skip"
    config.data.cache_dir = ""  # where local corpora are prepared as TFDS datasets ("" = WORKDIR/data)

    # Batches (bilm-tf: 128 rows per GPU x 3 GPUs, 20 steps).
    config.batch_size = 128  # global rows per step, split over processes and the mesh's data axis
    config.unroll_steps = 20  # T: tokens per window (truncated BPTT length)

    # Optimisation (bilm-tf's recipe).
    config.num_train_steps = 10_000
    # The optimiser, after clipping the gradient to a global norm of clip_norm (elmo_jax/training/optimizers.py):
    # "adagrad": bilm-tf's, TensorFlow's Adagrad (no epsilon); reads learning_rate and adagrad_initial_accumulator.
    # "adam": optax.adam (b1 0.9, b2 0.999, eps 1e-8), e.g. to fine-tune on domain text; reads learning_rate,
    #   which then needs setting (0.2 is Adagrad's; Adam is commonly run near 1e-3). Its moments move every
    #   softmax row at every step, so the softmax is updated densely (slower with a large vocabulary).
    # A workdir resumes only with the optimiser it was trained with.
    config.optimizer = "adagrad"
    config.learning_rate = 0.2  # the optimiser's step size
    config.adagrad_initial_accumulator = 1.0  # adagrad's accumulators start here
    config.clip_norm = 10.0  # global-norm gradient clipping, before the optimiser
    config.dropout = 0.1  # on each LSTM layer's input and on the top output
    config.loss_scale_by_unroll = True  # bilm-tf differentiates loss * unroll_steps
    # Chance that a training sentence is read from a zero LSTM state instead of the carried one. bilm-tf
    # uses 0; then the model only sees a zero state once (the first window), yet `embed` always starts
    # from one. Measured on the demo model (bench/RESULTS.md, "State resets"; full-softmax heldout
    # perplexity): with 0.05, carried and zero-state reading agree (248.0 / 248.8 at 600 steps) and three
    # seeds trained normally; with 0, all three seeds had one direction blow up to 1e7-1e10 within 400
    # steps (forward or backward, some recovering later) while the sampled training loss stayed normal:
    # that direction's outputs saturate against proj_clip and a few rare words, which the sampled
    # softmax seldom draws and so never pushes down, outscore the right word almost everywhere. The
    # trainer warns when an evaluation is worse than a uniform guess. configs/bilm_large.py keeps
    # bilm-tf's 0 (its published models evaluate normally at that scale).
    config.state_reset_probability = 0.05
    # The model a run stands for (its heldout evaluations, its export, `evaluate`, `export --workdir`,
    # `init_from` a workdir) is its biLM's weights averaged over recent steps, an exponential moving
    # average with this decay per step, debiased so that the start carries no weight, with the current
    # softmax (elmo_jax/training/weight_average.py; training itself continues from the last step's
    # weights). With bilm-tf's Adagrad a small biLM's last-step weights never settle: on the demo their
    # heldout perplexity moved 10-15% from one checkpoint to the next, one direction at a time, so a
    # run's figure depended on its seed and on the order of float sums (243 or 283 backward for the same
    # seed); averaged over its last ~50 steps it ends within 2.2% across seeds, summation orders and
    # device counts (bench/RESULTS.md, "Training that does not depend on luck"). It costs one more copy
    # of the biLM's weights and a pass over them per step. 0 = the last step's weights (bilm-tf's
    # recipe, kept by configs/bilm_large.py).
    config.weight_average_decay = 0.98
    config.n_negative_samples = 8192  # sampled-softmax candidates per direction and group of rows
    # Rows per candidate draw: the global batch's rows 0..g-1, g..2g-1, ... each draw their own
    # n_negative_samples candidates per direction (a group's draw depends on the step's key and the group's
    # index only, not on the mesh or the processes). bilm-tf draws one set per GPU batch of 128 rows, i.e.
    # three per step on its 3 GPUs. 0 = one draw for the whole batch; otherwise it must divide batch_size.
    # The expected gradient is the same either way; what differs is how often a rare word's softmax row is
    # a candidate, and so how fast Adagrad's accumulator for it grows (about G times more often with G
    # groups, each time with about 1/G of the gradient). 0 here: with the default 128 rows it is exactly
    # bilm-tf's per-GPU draw, and it fits any batch_size set on the command line.
    config.negative_sample_group_rows = 0
    config.full_softmax = False  # train with the full softmax (small vocabularies only)
    config.softmax_chunk = 8192  # vocabulary rows per step of the full softmax
    config.compute_dtype = "float32"  # matmul dtype: float32 or bfloat16 (state and accumulation stay float32)
    config.scan_unroll = 1  # lax.scan unroll of the LSTM time loop (speed only)
    # The char CNN runs once per distinct token of each device's share of a batch, its vectors copied to
    # every use (elmo_jax/model/distinct_tokens.py; the same numbers up to float32 rounding). Slots come
    # in eighths of a device's tokens, so a stream compiles a few more step variants.
    config.distinct_tokens = True
    # A NaN/Inf loss or gradient stops training, naming the step (the last checkpoint is the last good
    # state). N > 0 instead skips up to N such steps in all (parameters and optimiser state unchanged,
    # a warning and `nonfinite_skipped` in metrics.jsonl for each) and stops at the N+1-th.
    config.max_nonfinite_steps = 0
    # The persistent compilation cache (docs/COMPILATION_CACHE.md): the run's programs are kept on disk, so a
    # resumed run (or the next one of the same shapes) reads them instead of compiling them again. "" = the
    # default ($ELMO_JAX_COMPILATION_CACHE, else compilation_cache in ~/.cache/elmo_jax), or a directory,
    # gs://BUCKET/PATH, or "none" (off). A cache that cannot be used is a warning, never an error.
    config.compilation_cache = ""

    # Checkpoints, evaluation and logging.
    config.checkpoint_every_steps = 1000
    config.keep_checkpoints = 3  # newest complete checkpoints kept
    config.eval_every_steps = 1000  # heldout perplexity during training (0 = only at the end)
    config.eval_max_batches = 0  # cap on heldout windows per evaluation (0 = the whole heldout set)
    config.log_every_steps = 50
    # The export at the end of training (WORKDIR/export) includes the `jax.export` feature extractor
    # (extractor.jax, a few seconds to trace and serialize); False leaves it out (the weights, params.npz
    # and vocabulary are still there: `elmo_jax.load` and every command read the directory, and
    # `python -m elmo_jax.export --workdir=WORKDIR` writes a complete one later).
    config.export_extractor = True
    config.init_from = ""  # fine-tuning: start from a workdir, a model directory, or a published model ("small")
    # With init_from a training workdir: continue its Adagrad accumulators (True, as bilm-tf's restart.py
    # restores them), so fine-tuning takes steps as small as the source run's last ones; False restarts
    # them at adagrad_initial_accumulator, making the first steps as large as a new run's. A model
    # directory or HDF5 pair holds no optimiser state and always starts afresh (README: Fine-tuning).
    # True needs the source run's optimiser (its state, Adagrad's accumulators or Adam's moments, continues).
    config.init_from_optimizer = True

    # Device mesh (sizes multiply to the device count; one may be -1).
    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = -1
    config.mesh.model = 1
    return config


def published_model(name: str) -> dict:
    """The `config.model` keys of a published model size ("small", "medium", "original"), from the one
    table of them (`elmo_jax.model.config.PRESETS`): `config.model.update(published_model("small"))`."""
    fields = dataclasses.asdict(BiLMConfig.preset(name))
    del fields["extra_options"]  # not a config key: options-file keys beyond the architecture
    return fields
