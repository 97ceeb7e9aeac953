"""A tiny biLM (H 16, P 8, three small filters) and schedule: the model every test that trains uses, and a
smoke test of a new setup (a few seconds per hundred steps on one CPU core).

    python train.py --config=configs/tiny.py --workdir=/tmp/tiny \
        --config.data.train_files='corpus/*.txt' --config.data.heldout_files=heldout.txt

Without corpus files it trains on the embedded default corpus (its vocabulary is far larger than such
a model can use; give it a small corpus).
"""

try:  # the package's copy (installed, or this clone's editable install)
    from elmo_jax.configs import default
except ModuleNotFoundError:  # this clone on sys.path in a process begun before its install (a Colab kernel)
    from configs import default


def get_config():
    config = default.get_config()
    config.model.char_embed_dim = 4
    config.model.filters = ((1, 4), (2, 8), (3, 8))
    config.model.n_highway = 1
    config.model.lstm_dim = 16
    config.model.projection_dim = 8
    config.batch_size = 8
    config.unroll_steps = 5
    config.n_negative_samples = 8  # of a vocabulary of ~20: sampling and the log-Q correction are live
    config.negative_sample_group_rows = 4  # two candidate draws per direction, as bilm_large draws three
    config.num_train_steps = 100
    config.checkpoint_every_steps = 50
    config.eval_every_steps = 0
    config.log_every_steps = 1
    return config
