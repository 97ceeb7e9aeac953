"""Train an ELMo biLM: python train.py --config=configs/demo.py --workdir=/tmp/elmo_demo

Config values are overridden with --config.KEY=VALUE (e.g. --config.num_train_steps=500); a key that
does not exist is an error. Re-running the same command resumes from the newest checkpoint in WORKDIR.
"""

import logging as std_logging
import sys

from absl import app, flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file (see configs/default.py).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, the vocabulary and the export.")
flags.mark_flags_as_required(["config", "workdir"])


class _QuietLibraries:
    """Drops INFO records from orbax and TFDS internals (dozens per checkpoint); warnings pass."""

    def filter(self, record) -> bool:
        noisy = ("/orbax/" in record.pathname or "/tensorflow_datasets/" in record.pathname)
        return record.levelno >= std_logging.WARNING or not noisy


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from elmo_jax.trainer import TrainingError, train_and_evaluate  # after flag parsing: --help stays fast

    logging.get_absl_handler().addFilter(_QuietLibraries())
    try:
        config = FLAGS.config
    except Exception as e:  # config_flags defers loading the file until first use
        print(f"error: --config: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)
    try:
        train_and_evaluate(config, FLAGS.workdir)
    except (ValueError, OSError, TrainingError) as e:  # a person's mistake or a stopped run: one line
        logging.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with config mistakes (unknown key, bad value, missing file) as one line and exit 1."""
    try:
        return FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
        message = " ".join(str(e).replace("\\n", " ").replace("\\'", "'").split()).strip("\"'")
        key = next((a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.") and
                    a.split("=", 1)[0].rsplit(".", 1)[-1] in message), None)
        if key and isinstance(e.__context__ or e, (AttributeError, KeyError)):
            message = f"unknown config key ({message})"
        print(f"error: {key + ': ' if key else ''}{message}", file=sys.stderr)
        sys.exit(1)

if __name__ == "__main__":
    flags.FLAGS.alsologtostderr = True
    app.run(main, flags_parser=parse_flags)
