"""Two processes training together: `python train.py ... --coordinator_address=127.0.0.1:PORT --num_processes=2
--process_id=i`, each with 2 CPU devices (gloo collectives), on a (2, 2) mesh: data split over the two
processes, the softmax's vocabulary over each process's two devices.

Checked against one process (the test process, 8 devices, a (8, 1) mesh) with the same global batch, on
the session's corpus (its heldout sentences run out at different windows in the two processes' rows):
the same training losses and heldout perplexity, one metrics file written by process 0 only, and the
2-process checkpoint restored by a 1-process run that then continues exactly like an uninterrupted one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest

from elmo_jax.data.batch_stream import BiLMBatchStream
from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.training import loop
from tests.support.commands import REPO, command_argv, command_env
from tests.support.compare import TRAINING_EXPORT_FILES_WITHOUT_EXTRACTOR, read_metrics, restored
from tests.support.configs import tiny_config, tiny_flags

pytestmark = pytest.mark.slow
ATOL = 1e-5
STOP, END = 3, 5  # the 2-process run stops (and checkpoints) after STOP steps; the 1-process runs go to END
TIMEOUT = 240  # seconds for the 2-process run
OVERRIDES = {"eval_every_steps": STOP, "eval_max_batches": 0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(corpus, workdir: Path) -> None:
    """train.py as 2 processes with 2 CPU devices each; fails with both logs if either fails or hangs."""
    args = tiny_flags(
        corpus, workdir, **OVERRIDES, num_train_steps=STOP, checkpoint_every_steps=STOP, **{"mesh.model": 2}
    )
    env = command_env(devices=2)
    port = free_port()
    logs = [open(workdir.parent / f"process_{i}.log", "w+") for i in range(2)]
    processes = [
        subprocess.Popen(
            command_argv(
                "train.py", *args, f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"
            ),
            cwd=REPO,
            env=env,
            stdout=logs[i],
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    try:
        codes = [p.wait(timeout=TIMEOUT) for p in processes]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    output = []
    for i, log in enumerate(logs):
        log.seek(0)
        output.append(f"--- process {i} ---\n" + log.read()[-4000:])
        log.close()
    assert codes == [0, 0], f"exit codes {codes} (None: timed out after {TIMEOUT} s)\n" + "\n".join(output)


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """{"one": uninterrupted 1-process run to END, "two": 2-process run to STOP, "resumed": the 2-process
    workdir continued to END by 1 process}, each a workdir."""
    root = tmp_path_factory.mktemp("multihost")
    one, two = root / "one", root / "two" / "workdir"
    two.parent.mkdir()
    loop.train_and_evaluate(tiny_config(corpus, **OVERRIDES, num_train_steps=END, checkpoint_every_steps=END), str(one))
    run_two_processes(corpus, two)  # after the first run: the corpus is prepared, the processes only read it
    resumed = root / "resumed"
    shutil.copytree(two, resumed)
    loop.train_and_evaluate(
        tiny_config(corpus, **OVERRIDES, num_train_steps=END, checkpoint_every_steps=END), str(resumed)
    )
    return {"one": one, "two": two, "resumed": resumed}


def test_two_processes_train_like_one(runs, corpus):
    """Steps 1..STOP: the same losses (and gradient norms) as one process with the same global batch; the
    heldout perplexity at STOP, over a full pass whose rows end at different windows in the two
    processes, is the same too. Process 0 alone wrote the metrics (each step once)."""
    one, two = read_metrics(runs["one"], "train"), read_metrics(runs["two"], "train")
    assert [r["step"] for r in two] == list(range(1, STOP + 1))
    for a, b in zip(two, one[:STOP]):
        for key in ("loss", "forward_loss", "backward_loss", "grad_norm"):
            assert abs(a[key] - b[key]) <= ATOL, (a["step"], key, a[key], b[key])
        assert a["tokens"] == b["tokens"]
    heldout = Path(corpus["heldout"]).read_text(encoding="utf-8").splitlines()
    vocab = Vocab.load(os.path.join(runs["two"], "vocab.txt"))
    windows = [
        sum(
            1
            for _ in BiLMBatchStream(
                heldout, vocab, batch_size=8, unroll_steps=5, seed=None, repeat=False, process_index=i, process_count=2
            )
        )
        for i in range(2)
    ]
    assert windows[0] != windows[1], windows  # one process feeds empty windows while the other finishes
    (eval_two,), (eval_one,) = read_metrics(runs["two"], "eval"), read_metrics(runs["one"], "eval")[:1]
    assert eval_two["step"] == eval_one["step"] == STOP
    assert eval_two["tokens"] == eval_one["tokens"] > 0
    assert abs(eval_two["cross_entropy"] - eval_one["cross_entropy"]) <= ATOL
    assert sorted(os.listdir(runs["two"] / "export")) == TRAINING_EXPORT_FILES_WITHOUT_EXTRACTOR
    assert sorted(os.listdir(runs["two"] / "checkpoints")) == [str(STOP)]


def test_a_two_process_checkpoint_resumes_in_one_process(runs):
    """The checkpoint holds both processes' rows of the data stream; one process resumes from it and
    logs the uninterrupted run's steps STOP+1..END and ends with its state (within 1e-5) and exactly
    its data stream position."""
    _, data_two = restored(runs["two"], STOP)
    for direction in ("forward", "backward"):
        assert sorted(map(int, data_two[direction])) == list(range(8))
    resumed, one = read_metrics(runs["resumed"], "train"), read_metrics(runs["one"], "train")
    assert [r["step"] for r in resumed] == list(range(1, END + 1))
    for a, b in zip(resumed[STOP:], one[STOP:]):
        assert abs(a["loss"] - b["loss"]) <= ATOL, (a["step"], a["loss"], b["loss"])
    state_resumed, data_resumed = restored(runs["resumed"], END)
    state_one, data_one = restored(runs["one"], END)
    assert data_resumed == data_one
    leaves_resumed, tree_resumed = jax.tree.flatten(state_resumed)
    leaves_one, tree_one = jax.tree.flatten(state_one)
    assert tree_resumed == tree_one
    for x, y in zip(leaves_resumed, leaves_one):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=ATOL, rtol=0)
