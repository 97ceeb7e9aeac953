"""A run whose workdir is moved or replaced while it trains (issue #50, item 2): run A trains in W; W is
renamed (`mv W W.old`) and run B starts in a new W, or W is deleted and made again. The directory lock
rightly lets B in (it locks the new directory), but A went on writing by the path: its metrics log
re-created W/metrics.jsonl inside B's directory (every step logged twice there) until a checkpoint
failed. Now A stops at its next write, in one line naming why, and writes nothing more into W.

The file alone deleted or replaced is another fault, and keeps its answer: the log re-creates it with a
warning (docs/FAULTS.md; `test_faults.py::test_metrics_jsonl_deleted_during_a_run_is_recreated`).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from elmo_jax.training.metrics_log import MetricsLog
from elmo_jax.training.workdir import LOCK_FILE, WorkdirLock, WorkdirMovedError, make_workdir
from tests.support.commands import error_line
from tests.support.compare import tree_digest
from tests.support.configs import tiny_flags
from tests.support.inprocess import run_in_process

B_RECORD = '{"step": 1, "kind": "train", "run": "B"}\n'


def move_aside(workdir) -> None:
    """`mv W W.old`, then run B makes W again and logs its first record."""
    os.rename(workdir, f"{workdir}.old")
    _start_b(workdir)


def delete_and_recreate(workdir) -> None:
    """`rm -r W`, then run B makes W again and logs its first record."""
    shutil.rmtree(workdir)
    _start_b(workdir)


def _start_b(workdir) -> None:
    os.mkdir(workdir)
    with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.write(B_RECORD)


REPLACEMENTS = {"moved aside": move_aside, "deleted and made again": delete_and_recreate}


def check_stopped(error: BaseException, workdir, replace: str) -> None:
    """The one line naming the workdir, why, and where it went when it was moved aside (Linux's /proc)."""
    message = str(error)
    assert f"the workdir {workdir} is no longer the directory this run locked (moved or replaced" in message
    if replace == "moved aside":
        assert f"; it is now {workdir}.old)" in message, message
    assert message.endswith("): stopping; nothing more is written"), message


@pytest.mark.parametrize("replace", sorted(REPLACEMENTS))
def test_the_metrics_log_stops_before_writing_into_a_replaced_workdir(tmp_path, replace):
    """At the level of the lock and the log, no training: the record after the replacement is refused
    with `WorkdirMovedError` and neither it nor its TensorBoard event reaches the new W. Before, the log
    said "was deleted or replaced ... re-creating it" and appended A's record to B's metrics.jsonl (this
    test failed on the `check_workdir` argument the log did not have; written without it, with "DID NOT
    RAISE")."""
    workdir = tmp_path / "w"
    make_workdir(str(workdir))
    with WorkdirLock(str(workdir)) as lock:
        log = MetricsLog(str(workdir), check_workdir=lock.check)
        log.write(1, {"loss": 5.0})
        REPLACEMENTS[replace](workdir)
        b_before = tree_digest(workdir)
        with pytest.raises(WorkdirMovedError) as stopped:
            log.write(2, {"loss": 4.0})
        check_stopped(stopped.value, workdir, replace)
        with pytest.raises(WorkdirMovedError):
            log.flush()  # what a checkpoint does first
        log.close()
    assert tree_digest(workdir) == b_before
    assert sorted(os.listdir(workdir)) == ["metrics.jsonl"]
    if replace == "moved aside":  # A's records and lock went with its directory, as they were
        old = tmp_path / "w.old"
        assert [json.loads(line)["step"] for line in (old / "metrics.jsonl").read_text().splitlines()] == [1]
        assert (old / LOCK_FILE).read_text() == ""  # released


def test_the_metrics_file_alone_deleted_is_still_recreated(tmp_path, caplog):
    """The check is on the directory: metrics.jsonl deleted while W stays the locked directory keeps its
    old answer (docs/FAULTS.md), a warning and a new file. It guards the new check against being made on
    the file rather than the directory (before, it failed only on the `check_workdir` argument)."""
    workdir = tmp_path / "w"
    make_workdir(str(workdir))
    with WorkdirLock(str(workdir)) as lock:
        log = MetricsLog(str(workdir), check_workdir=lock.check)
        log.write(1, {"loss": 5.0})
        os.remove(workdir / "metrics.jsonl")
        log.write(2, {"loss": 4.0})
        log.close()
    assert "was deleted or replaced while this run was writing it" in caplog.text
    assert [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()] == [2]


def test_a_training_run_whose_workdir_is_moved_stops_at_its_next_record(corpus, tmp_path, monkeypatch):
    """The same through train.py (its `main` in this process, a 6-step tiny run): W is moved aside and
    made again by "run B" as step 3's record is about to be written. The run ends there in one `error:`
    line, exit 1, before the step-3 record, the checkpoint of step 6 or the export; B's W holds only what
    B wrote. Before, the run went on to the end, exit 0 (this test failed on the exit code), writing
    steps 3-6 and the final evaluation into B's metrics.jsonl, and its checkpoint and export into B's W."""
    workdir = tmp_path / "w"
    write = MetricsLog.write
    moved = []

    def replace_before_step_3(self, step, metrics, kind="train"):
        if step == 3 and not moved:
            moved.append(step)
            move_aside(workdir)
        return write(self, step, metrics, kind)

    monkeypatch.setattr(MetricsLog, "write", replace_before_step_3)
    flags = tiny_flags(
        corpus, workdir, num_train_steps=6, checkpoint_every_steps=6, eval_every_steps=0, log_every_steps=1
    )
    line = error_line(run_in_process("train.py", *flags))
    check_stopped(line[len("error: ") :], workdir, "moved aside")
    assert os.listdir(workdir) == ["metrics.jsonl"] and (workdir / "metrics.jsonl").read_text() == B_RECORD
    old = tmp_path / "w.old"
    assert [json.loads(line)["step"] for line in (old / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert not os.listdir(old / "checkpoints")  # the stop came before step 6's checkpoint
