"""Train an ELMo biLM: elmo-train --config=demo --workdir=/tmp/elmo_demo
(in a clone of the repository: python train.py --config=configs/demo.py --workdir=/tmp/elmo_demo)

--config names a config file (configs/*.py in a clone: configs/default.py lists every key) or one of the
package's configs by name, the same files installed with it: default, demo, tiny, bilm_small, bilm_medium,
bilm_large. An argument for the config's get_config follows a colon (--config=bilm_large:/data/lm1b).
Config values are overridden with --config.KEY=VALUE (e.g. --config.num_train_steps=500); a key that
does not exist is an error. Re-running the same command resumes from the newest checkpoint in
WORKDIR: after SIGTERM (preemption) or Ctrl-C, which finish the step, save a checkpoint and exit 0,
and after a crash or `kill -9`, which lose at most the steps since the last checkpoint.

Several processes (hosts) run the same command, each with its own --process_id (docs/SCALING.md has
the commands for TPU pod slices and GPU machines):
    elmo-train ... --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0   # host 0
    elmo-train ... --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=1   # host 1
On a Cloud TPU pod slice (or under SLURM / Open MPI) --distributed alone lets JAX find the others;
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID work as the flags do.

--workdir and the config's paths (corpus globs, vocab_file, cache_dir, init_from) may be in Cloud Storage,
gs://BUCKET/PATH, which every host of a pod slice sees (the gcs extra, docs/CLOUD_STORAGE.md).
"""

import importlib.resources
import logging as std_logging
import os
import sys
import traceback

from absl import flags, logging
from ml_collections import config_flags

from elmo_jax import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    """train.py's flags (defined when it runs as a program; the tests run `main` in-process too)."""
    config_flags.DEFINE_config_file(
        "config",
        None,
        "Training config: a file (configs/default.py lists every key) or a config's name.",
        lock_config=True,
    )
    flags.FLAGS["config"].parser = _CheckedConfigFile(flags.FLAGS["config"].parser)
    flags.DEFINE_string(
        "workdir", None, "Directory (or gs://BUCKET/PATH) for checkpoints, metrics, the vocabulary and the export."
    )
    flags.mark_flags_as_required(["config", "workdir"])
    cli.define_distributed_flags()
    flags.DEFINE_list("local_device_ids", None, "Devices this process uses (default: all it sees).")


class _CheckedConfigFile:
    """ml_collections' parser of --config (`parser`, whose other attributes it passes on), with a config
    file that cannot be loaded refused as it is parsed, in one line naming the file (and the line at
    fault): ml_collections says a missing one only once the config is used, naming a module of its own
    ("Failed loading config file config_config"), and lets a file that is no Python, or whose
    get_config() fails, end in a traceback."""

    def __init__(self, parser):
        self.parser = parser

    def __getattr__(self, name):
        return getattr(self.parser, name)

    def parse(self, path):
        path = _config_path(path)
        file = path.split(":", 1)[0]  # "FILE:ARGUMENT" passes ARGUMENT to get_config
        if not os.path.exists(file):
            raise ValueError(_missing_config(file))
        if os.path.isdir(file):
            raise ValueError("is a directory, expected a config file (configs/*.py)")
        try:
            config = self.parser.parse(path)
            getattr(config, "lock", None)  # a config that failed to load raises OSError on any attribute
        except SyntaxError as e:
            raise ValueError(f"line {e.lineno}: not Python ({e.msg})") from None
        except OSError as e:
            cause = e.__cause__ or e
            raise ValueError(f"cannot load it: {' '.join(str(cause).split())}") from None
        except Exception as e:
            raise ValueError(_get_config_failure(file, e)) from None
        return config


def _named_configs() -> dict[str, str]:
    """The package's configs by name ("demo": the path of its file): the repository's configs/ that define
    get_config, installed with the package as elmo_jax.configs (pyproject.toml's package-dir)."""
    try:
        folder = importlib.resources.files("elmo_jax.configs")
    except ModuleNotFoundError:  # a clone whose editable install predates elmo_jax.configs: pip install -e .
        return {}
    files = (f for f in folder.iterdir() if f.name.endswith(".py"))
    return {f.name[: -len(".py")]: str(f) for f in files if "\ndef get_config(" in f.read_text(encoding="utf-8")}


def _config_path(value: str) -> str:
    """--config's value with a config's name (`demo`, `bilm_large:/data/lm1b`) turned into its file's path;
    a file of that name, or any other value, is left as it is."""
    name, colon, argument = value.partition(":")
    if os.path.exists(name) or not name.isidentifier():
        return value
    path = _named_configs().get(name)
    return value if path is None else f"{path}{colon}{argument}"


def _missing_config(file: str) -> str:
    """Why --config names nothing: no file and no config of that name, with the names there are."""
    names = ", ".join(sorted(_named_configs())) or "none installed"
    if file.isidentifier():
        return f"no such file, nor a config of that name (the package's configs: {names})"
    stem = os.path.splitext(os.path.basename(file))[0]
    if stem in _named_configs():
        return f"no such file (outside a clone of the repository, name the package's config: --config={stem})"
    return "no such file"


def _get_config_failure(file: str, error: Exception) -> str:
    """What went wrong in the config file's code (the flag's value names the file): the exception and the
    file's line it came from."""
    original = error.__context__ if str(error).startswith("Error whilst parsing config file") else error
    lines = [
        f.lineno
        for f in traceback.extract_tb(original.__traceback__)
        if os.path.abspath(f.filename) == os.path.abspath(file)
    ]
    where = f" at line {lines[-1]}" if lines else ""
    return f"get_config() failed{where}: {type(original).__name__}: {' '.join(str(original).split())}"


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
    from elmo_jax.training.checkpoint import CheckpointWriteError
    from elmo_jax.training.preemption import Stopped
    from elmo_jax.training.step_report import TrainingError

    logging.get_absl_handler().addFilter(_QUIET_LIBRARIES)
    cli.run_main(
        _train,
        argv,
        hint="; settings go in --config.KEY=VALUE flags",
        errors=(ValueError, OSError, TrainingError),  # a person's mistake or a stopped run: one line
        # Orbax threads of the failed write may still be running or waiting; none of them may outlive (or
        # print after) the one error line.
        fatal=(CheckpointWriteError,),
        stops=(Stopped,),  # preemption (SIGTERM) or Ctrl-C: the checkpoint is saved, a re-run resumes
        # Before the training loop installs its own handlers (after start-up), or after it.
        interrupted=" outside the training loop; no step was lost (re-run the same command to resume from the "
        "newest checkpoint)",
    )


def _train() -> None:
    from elmo_jax.training.loop import train_and_evaluate

    config = _config()
    _start_distributed()
    train_and_evaluate(config, FLAGS.workdir)


def _config():
    """--config's value: config_flags loads the file when it is first asked for it."""
    try:
        return FLAGS.config
    except Exception as e:
        print(f"error: --config: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)


_QUIET_LIBRARIES = _QuietLibraries()


def _start_distributed() -> None:
    """`jax.distributed.initialize()` when this is one of several processes (before any device use)."""
    local_devices = tuple(int(i) for i in FLAGS.local_device_ids) if FLAGS.local_device_ids else None
    cli.cluster(local_devices).start()


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing (`cli.parse_flags`), with config mistakes (unknown key, bad value, missing file) as one
    line and exit 1."""
    return cli.parse_flags(
        argv, errors=(flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError), describe=_config_error
    )


def _config_error(error: BaseException, argv: list[str]) -> str:
    """The error line of a config mistake, naming the --config.KEY it comes from."""
    message = " ".join(str(error).replace("\\n", " ").replace("\\'", "'").split()).strip("\"'")
    key = next(
        (
            a.split("=", 1)[0]
            for a in argv[1:]
            if a.startswith("--config.") and a.split("=", 1)[0].rsplit(".", 1)[-1] in message
        ),
        None,
    )
    if key and isinstance(error.__context__ or error, (AttributeError, KeyError)):
        message = f"unknown config key ({message})"
    return f"{key + ': ' if key else ''}{message}"


def start() -> None:
    """The command: `elmo-train` (pyproject.toml's [project.scripts]), `python -m elmo_jax.train` and the
    repository's `python train.py`."""
    flags.FLAGS.alsologtostderr = True
    cli.start(main, define_flags, flags_parser=parse_flags)


if __name__ == "__main__":
    start()
