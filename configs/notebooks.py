"""The sizes the notebooks (notebooks/*.ipynb) train with, per backend and device count, in one place.

The notebooks call these functions; bench/notebook_tpu_sizes.py compiles the very same configs for
single-chip TPUs (v5e-1, v6e-1: Colab's TPU runtimes) and the notebooks' size tables quote its figures.

    config = notebooks.train_bilm("tpu", jax.device_count(), lm1b=False)

Every mesh is data-parallel only (`mesh.data = -1`, `mesh.model = 1`), so any device count works: one chip,
a v5e-4 or v6e-8 slice, several GPUs, or the CPU; the softmax's rows are split over every device either way
(elmo_jax/training/sharding.py). `mesh_model` checks a requested model axis.
"""

import json
import os

try:  # the package's copy (installed, or this clone's editable install)
    from elmo_jax.configs import bilm_small, default, demo
except ModuleNotFoundError:  # this clone on sys.path in a process begun before its install (a Colab kernel)
    from configs import bilm_small, default, demo

ROWS_PER_TPU_CHIP = 128  # bilm-tf trained with 128 rows per GPU; a v5e chip holds this easily (see bench)
ROWS_PER_GPU = 128


def smoke(config):
    """CI's smoke sizes: a biLM of a few thousand parameters and a few dozen steps, so every cell runs in
    seconds; the numbers mean nothing."""
    config.model.char_embed_dim = 4
    config.model.filters = ((1, 4), (2, 8), (3, 8))
    config.model.n_highway = 1
    config.model.lstm_dim = 16
    config.model.projection_dim = 8
    config.batch_size = 8
    config.unroll_steps = 10
    config.n_negative_samples = 64
    config.num_train_steps = 20
    config.checkpoint_every_steps = 20
    config.eval_every_steps = 10
    config.eval_max_batches = 5
    config.log_every_steps = 5
    config.export_extractor = False  # the cells read the weights; the training notebook's export command writes it
    return config


def train_bilm(backend: str, n_devices: int, *, lm1b: bool = False, smoke_test: bool = False):
    """The training notebook's run: the published small shape on an accelerator, the demo model on CPU.

    Args:
      backend: "tpu", "gpu" or "cpu" (`jax.default_backend()`).
      n_devices: `jax.device_count()`.
      lm1b: training on TFDS lm1b (more steps) rather than the default corpus or your files.
      smoke_test: CI's tiny sizes instead.
    """
    if smoke_test:
        return smoke(default.get_config())
    if backend in ("tpu", "gpu"):
        config = bilm_small.get_config()
        config.batch_size = (ROWS_PER_TPU_CHIP if backend == "tpu" else ROWS_PER_GPU) * n_devices
        config.num_train_steps = 20_000 if lm1b else 4_000
        config.checkpoint_every_steps = 500
        config.eval_every_steps = 500
        config.eval_max_batches = 200
        config.log_every_steps = 50
        if not lm1b:
            config.n_negative_samples = 4096  # the default corpus has ~15k words
    else:
        config = demo.get_config()
        config.eval_every_steps = 200
    return config


def demo_bilm(backend: str, n_devices: int, *, smoke_test: bool = False):
    """The biLM the features notebook trains when it has no model, and the domain notebook's general
    model: configs/demo.py (LSTM 256, projection 64, 32 rows) on every backend, a few minutes on a CPU.

    Args: as `train_bilm` (the sizes do not depend on the backend: the point is a model in minutes).
    """
    del backend, n_devices
    return smoke(default.get_config()) if smoke_test else demo.get_config()


def mesh_model(requested: int, n_devices: int) -> tuple[int, str]:
    """(devices on the model axis, a note) for a requested model axis: the request if the devices split
    into groups of it and the padded softmax rows split over it, else 1 (data-parallel) with a note why."""
    if requested <= 1:
        return 1, ""
    from elmo_jax.training.softmax import VOCAB_PAD_MULTIPLE  # the softmax rows are padded to a multiple of it

    if n_devices % requested or VOCAB_PAD_MULTIPLE % requested:
        return 1, (
            f"MESH_MODEL = {requested} does not divide {n_devices} device(s) (and {VOCAB_PAD_MULTIPLE} softmax rows); "
            "using 1: every device takes its share of the batch (and of the softmax's rows where they split evenly)"
        )
    return requested, ""


def run_workdir(work_root: str, run_name: str) -> str:
    """The training notebook's workdir: `run_name` (RUN_NAME) under `work_root` (WORK_ROOT).

    Raises:
      ValueError: `run_name` is not one folder name: empty or blank (joining "" gives WORK_ROOT itself,
        which holds the other runs, the corpora and the models, and which the copy to Drive would empty),
        "." or "..", or holding a "/" (an absolute one would replace WORK_ROOT).
    """
    if not run_name.strip() or run_name in (".", "..") or "/" in run_name or os.sep in run_name:
        raise ValueError(
            f"RUN_NAME={run_name!r}: expected the name of this run's folder under WORK_ROOT ({work_root}), e.g. "
            '"train_bilm" (no "/"; "" would make WORK_ROOT itself the workdir); set it in the parameters cell'
        )
    return os.path.join(work_root, run_name)


RUN_RECORD = "notebook_run.json"  # in a notebook's workdir: the backend and sizes it was started with
_SIZE_KEYS = ("batch_size", "unroll_steps", "model.lstm_dim", "model.projection_dim", "model.filters", "model.n_layers")


def check_same_run(workdir: str, config, backend: str, n_devices: int) -> None:
    """Records, in a notebook's workdir, the backend and sizes its run started with; a later session whose
    sizes differ (another runtime: the sizes follow the backend and the device count) is refused with what
    to do, before training would refuse the checkpoints less plainly.

    The workdir's name does not depend on the backend, so that a run started on a TPU runtime is found again
    by the next TPU session; this record is what tells a CPU session that it cannot continue it.

    Raises:
      ValueError: the workdir holds a run of other sizes; the message names both and the way out.
    """
    sizes = {key: _value(config, key) for key in _SIZE_KEYS}
    started = {"backend": backend, "devices": n_devices, "sizes": sizes}
    path = os.path.join(workdir, RUN_RECORD)
    if not os.path.exists(path):
        os.makedirs(workdir, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(started, f, indent=1)
        os.replace(path + ".tmp", path)
        return
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if json.loads(json.dumps(sizes)) != record["sizes"]:  # compared as JSON, as recorded (tuples as lists)
        raise ValueError(
            f"{workdir} holds a run started on {record['devices']} {record['backend']} device(s) with "
            f"{_describe(record['sizes'])}; this runtime ({n_devices} {backend} device(s)) trains "
            f"{_describe(json.loads(json.dumps(sizes)))}, so that run cannot continue here. Connect to a "
            f"{record['backend']} runtime with {record['devices']} device(s) to continue it, or set RUN_NAME in "
            "the parameters cell to start another run beside it"
        )


def _value(config, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def _describe(sizes: dict) -> str:
    return (
        f"batch {sizes['batch_size']} x {sizes['unroll_steps']} tokens, LSTM {sizes['model.lstm_dim']}, "
        f"projection {sizes['model.projection_dim']}"
    )
