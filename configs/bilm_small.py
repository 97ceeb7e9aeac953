"""The published "small" ELMo shape (2x1024_128_2048cnn_1xhighway): H 1024, P 128, 1 highway."""

from elmo_jax.configs import default


def get_config():
    config = default.get_config()
    config.model.update(default.published_model("small"))
    return config
