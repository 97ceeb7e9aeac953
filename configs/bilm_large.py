"""The published original ELMo (2x4096_512_2048cnn_2xhighway) on the 1B Word Benchmark.

bilm-tf's recipe: 128 rows x 20 steps per GPU on 3 GPUs, Adagrad 0.2 (accumulators from 1.0), the loss
times unroll_steps clipped to global norm 10, dropout 0.1, 10 epochs of 768,648,884 tokens; 8192 sampled
negatives per direction drawn for each GPU's 128 rows (three independent sets per step, here one per
group of 128 rows of the 384); each row's LSTM state carried from window to window and never reset.
The vocabulary is bilm-tf's 1B-Word file (793,471 entries).

The corpus, prepared once in bounded memory without TensorFlow (`python -m elmo_jax.prepare_lm1b`), then
named after the config file:
    python -m elmo_jax.prepare_lm1b --data_dir=/data/lm1b
    python train.py --config=configs/bilm_large.py:/data/lm1b --workdir=... \
        --config.data.vocab_file=vocab-2016-09-10.txt
(installed, outside a clone: elmo-train --config=bilm_large:/data/lm1b ...)
Without ":DATA_DIR" it reads TFDS's own `lm1b`, prepared with TFDS (`--config.data.tfds_data_dir=...`).
"""

try:  # the package's copy (installed, or this clone's editable install)
    from elmo_jax.configs import default
except ModuleNotFoundError:  # this clone on sys.path in a process begun before its install (a Colab kernel)
    from configs import default

TRAIN_TOKENS = 768_648_884

# Tested meshes per TPU type: (mesh.data, mesh.model, batch_size), 128 rows per chip as bilm-tf's GPUs had.
# Each was compiled by libtpu for that topology with the char CNN at 24 positions and bfloat16 compute
# (bench/tpu_compile.py; per-chip memory plans and roofline step times in bench/RESULTS_tpu_compile.md)
# and plans at most 85% of the chip's HBM. Data-parallel meshes: the softmax's rows are split over every
# chip anyway (elmo_jax/training/sharding.py), and a model axis would make each chip of a model group
# repeat the biLM's work (only the softmax is split over it). Pass them as --config.mesh.data, --config.mesh.model
# and --config.batch_size (and num_train_steps for 10 epochs: 10 * TRAIN_TOKENS // (batch_size * 20)).
TPU_MESHES = {
    "v5e-1": (1, 1, 128),
    "v5e-8": (8, 1, 1024),
    "v6e-1": (1, 1, 128),
    "v6e-8": (8, 1, 1024),
    "v4-8": (4, 1, 512),  # 4 chips of 2 TensorCores, one device each (megacore)
    "v5p-8": (4, 1, 512),  # the same
}


def get_config(lm1b_dir: str = ""):
    config = default.get_config()  # the model defaults are the original's
    if lm1b_dir:  # prepared by python -m elmo_jax.prepare_lm1b --data_dir=lm1b_dir
        from elmo_jax.data import lm1b

        config.data.train_files, config.data.heldout_files = lm1b.text_globs(lm1b_dir)
        config.data.cache_dir = lm1b_dir
    else:
        config.data.tfds_name = "lm1b"
        config.data.tfds_train_split = "train"
        config.data.tfds_heldout_split = "test"
    config.batch_size = 384  # 128 rows x 3 devices, as published
    config.unroll_steps = 20
    config.negative_sample_group_rows = 128  # one candidate draw per direction per GPU batch, as bilm-tf
    # bilm-tf never resets the carried state. Small models trained that way can have one direction blow
    # up under the full softmax (configs/default.py, bench/RESULTS.md "State resets"); bilm-tf's published
    # models did not at this scale, and the periodic heldout evaluation warns if it happens.
    config.state_reset_probability = 0.0
    # bilm-tf exports the last step's weights; the biLM's moving average (configs/default.py) would keep a
    # second copy of its 93.6M weights on every chip and read and write it every step.
    config.weight_average_decay = 0.0
    config.num_train_steps = 10 * TRAIN_TOKENS // (384 * 20)  # 10 epochs
    config.checkpoint_every_steps = 5000
    config.eval_every_steps = 50_000
    config.eval_max_batches = 2000
    config.log_every_steps = 100
    return config
