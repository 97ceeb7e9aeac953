"""Train an ELMo biLM from a clone of the repository: python train.py --config=configs/demo.py --workdir=DIR

The repository's entry point, as the Flax examples' main.py: the command is elmo_jax/train.py (installed as
`elmo-train`, also `python -m elmo_jax.train`), whose usage and flags `python train.py --help` prints.
"""

from elmo_jax.train import main, start  # noqa: F401  (main: what the tests run in-process as "train.py")

if __name__ == "__main__":
    start()
