"""A CPU demo: a small biLM trained for a few minutes on the embedded default corpus.

python train.py --config=configs/demo.py --workdir=/tmp/elmo_demo
"""

try:  # the package's copy (installed, or this clone's editable install)
    from elmo_jax.configs import default
except ModuleNotFoundError:  # this clone on sys.path in a process begun before its install (a Colab kernel)
    from configs import default


def get_config():
    config = default.get_config()
    config.model.char_embed_dim = 8
    config.model.filters = ((1, 16), (2, 16), (3, 32), (4, 64), (5, 128))
    config.model.n_highway = 1
    config.model.lstm_dim = 256
    config.model.projection_dim = 64
    config.data.max_vocab_size = 20_000
    config.batch_size = 32
    config.unroll_steps = 20
    config.num_train_steps = 600
    config.n_negative_samples = 1024
    config.checkpoint_every_steps = 200
    config.eval_every_steps = 0
    config.eval_max_batches = 60
    config.log_every_steps = 25
    return config
