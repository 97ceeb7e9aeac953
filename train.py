"""Train an ELMo biLM: python train.py --config=configs/demo.py --workdir=/tmp/elmo_demo

Config values are overridden with --config.KEY=VALUE (e.g. --config.num_train_steps=500); a key that
does not exist is an error. Re-running the same command resumes from the newest checkpoint in
WORKDIR: after SIGTERM (preemption) or Ctrl-C, which finish the step, save a checkpoint and exit 0,
and after a crash or `kill -9`, which lose at most the steps since the last checkpoint.

Several processes (hosts) run the same command, each with its own --process_id (docs/SCALING.md has
the commands for TPU pod slices and GPU machines):
    python train.py ... --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0   # host 0
    python train.py ... --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=1   # host 1
On a Cloud TPU pod slice (or under SLURM / Open MPI) --distributed alone lets JAX find the others;
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID work as the flags do.

--workdir and the config's paths (corpus globs, vocab_file, cache_dir, init_from) may be in Cloud Storage,
gs://BUCKET/PATH, which every host of a pod slice sees (pip install 'elmo-jax[gcs]'; docs/CLOUD_STORAGE.md).
"""

import logging as std_logging
import sys

from absl import flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS


def define_flags() -> None:
    """train.py's flags (defined when it runs as a program; the tests run `main` in-process too)."""
    from elmo_jax import cli

    config_flags.DEFINE_config_file("config", None, "Training config file (see configs/default.py).", lock_config=True)
    flags.DEFINE_string(
        "workdir", None, "Directory (or gs://BUCKET/PATH) for checkpoints, metrics, the vocabulary and the export."
    )
    flags.mark_flags_as_required(["config", "workdir"])
    cli.define_distributed_flags()
    flags.DEFINE_list("local_device_ids", None, "Devices this process uses (default: all it sees).")


class _QuietLibraries:
    """Drops INFO records from orbax and TFDS internals (dozens per checkpoint); warnings pass, without
    orbax's tracebacks (a failed checkpoint write logs several from its threads; the trainer reports the
    failure itself, in one line naming the checkpoint)."""

    def filter(self, record) -> bool:
        noisy = "/orbax/" in record.pathname or "/tensorflow_datasets/" in record.pathname
        if noisy and record.exc_info:
            record.exc_info, record.exc_text = None, None
        return record.levelno >= std_logging.WARNING or not noisy


def main(argv):
    from elmo_jax import cli  # after flag parsing: --help stays fast
    from elmo_jax.training.checkpoint import CheckpointWriteError
    from elmo_jax.training.loop import train_and_evaluate
    from elmo_jax.training.preemption import Stopped
    from elmo_jax.training.step_report import TrainingError

    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}; settings go in --config.KEY=VALUE flags", file=sys.stderr)
        sys.exit(1)
    logging.get_absl_handler().addFilter(_QUIET_LIBRARIES)
    try:
        config = FLAGS.config
    except Exception as e:  # config_flags defers loading the file until first use
        print(f"error: --config: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)
    try:
        # Until the training loop installs its own handlers (after start-up), SIGTERM ends start-up like
        # Ctrl-C does, with one line.
        with cli.sigterm_raises():
            _start_distributed()
            train_and_evaluate(config, FLAGS.workdir)
    except Stopped as e:  # preemption (SIGTERM) or Ctrl-C: the checkpoint is saved, a re-run resumes
        logging.warning("%s", e)
        print(str(e), file=sys.stderr)
    except CheckpointWriteError as e:
        _error_line(e)
        # Orbax threads of the failed write may still be running or waiting; none of them may outlive
        # (or print after) the one error line.
        cli.exit_now(1)
    except (ValueError, OSError, TrainingError) as e:  # a person's mistake or a stopped run: one line
        _error_line(e)
        sys.exit(1)
    except (KeyboardInterrupt, cli.Terminated) as e:  # before the loop took over the signals, or after it
        print(
            f"stopped by {cli.signal_name(e)} outside the training loop; no step was lost (re-run the same "
            "command to resume from the newest checkpoint)",
            file=sys.stderr,
        )
        cli.exit_now(cli.interrupted_exit_code(e))


_QUIET_LIBRARIES = _QuietLibraries()


def _error_line(error: BaseException) -> None:
    logging.error("%s", error)
    print(f"error: {' '.join(str(error).split())}", file=sys.stderr)


def _start_distributed() -> None:
    """`jax.distributed.initialize()` when this is one of several processes (before any device use)."""
    from elmo_jax import cli
    from elmo_jax.training import multihost

    local_devices = [int(i) for i in FLAGS.local_device_ids] if FLAGS.local_device_ids else None
    multihost.start(*cli.distributed_start_args(), local_devices)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with config mistakes (unknown key, bad value, missing file) as one line and exit 1."""
    try:
        return FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
        message = " ".join(str(e).replace("\\n", " ").replace("\\'", "'").split()).strip("\"'")
        key = next(
            (
                a.split("=", 1)[0]
                for a in argv[1:]
                if a.startswith("--config.") and a.split("=", 1)[0].rsplit(".", 1)[-1] in message
            ),
            None,
        )
        if key and isinstance(e.__context__ or e, (AttributeError, KeyError)):
            message = f"unknown config key ({message})"
        print(f"error: {key + ': ' if key else ''}{message}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    from elmo_jax import cli

    flags.FLAGS.alsologtostderr = True
    cli.start(main, define_flags, flags_parser=parse_flags)
