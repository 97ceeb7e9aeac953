"""The published "small" ELMo shape (2x1024_128_2048cnn_1xhighway): H 1024, P 128, 1 highway."""

try:  # the package's copy (installed, or this clone's editable install)
    from elmo_jax.configs import default
except ModuleNotFoundError:  # this clone on sys.path in a process begun before its install (a Colab kernel)
    from configs import default


def get_config():
    config = default.get_config()
    config.model.update(default.published_model("small"))
    return config
