"""The published "medium" ELMo shape (2x2048_256_2048cnn_1xhighway): H 2048, P 256, 1 highway."""

from elmo_jax.configs import default


def get_config():
    config = default.get_config()
    config.model.update(default.published_model("medium"))
    return config
