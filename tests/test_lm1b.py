"""The 1B Word Benchmark prepared without TFDS: `python -m elmo_jax.prepare_lm1b` on an archive laid out
like statmt.org's (99 training and 50 heldout files of a few lines each, plus files that must not be
extracted), read back by a training config (`configs/bilm_large.py:DATA_DIR`); the archive downloaded
from a loopback HTTP server (`tests.support.file_server`) through `formats.download`: resumed after
broken connections, and checked against TFDS's size and SHA-256 under statmt.org's name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from configs import bilm_large
from elmo_jax.data import lm1b, local_corpus
from elmo_jax.data.training_corpus import open_training_data
from elmo_jax.formats import download
from tests.support.commands import error_line, run_command
from tests.support.file_server import FileServer
from tests.support.inprocess import run_in_process
from tests.support.lm1b_archive import MTIME, expected_train, heldout_lines, write_archive


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    return write_archive(tmp_path_factory.mktemp("archive") / "lm1b.tar.gz")


def test_prepare_from_a_downloaded_archive_and_reuse(archive, tmp_path, monkeypatch):
    """The splits hold the archive's lines in file order, normalised; only the text files are extracted,
    with the archive's times; a second call downloads, extracts and writes nothing."""
    data_dir = tmp_path / "data"
    corpus = lm1b.prepare_lm1b(data_dir, source=f"file://{archive}")
    assert list(local_corpus.open_split(corpus, "train")) == expected_train()
    assert list(local_corpus.open_split(corpus, "test")) == [line for i in range(50) for line in heldout_lines(i)]
    train_glob, heldout_glob = lm1b.text_globs(data_dir)
    top = os.path.dirname(os.path.dirname(train_glob))
    assert sorted(os.listdir(top)) == [lm1b.HELDOUT_DIR, lm1b.TRAIN_DIR]
    assert os.stat(os.path.join(top, lm1b.TRAIN_DIR, "news.en-00001-of-00100")).st_mtime == MTIME
    assert not os.path.exists(tmp_path / "outside.txt") and not os.path.exists(data_dir / "outside.txt")
    assert os.listdir(data_dir / "downloads") == ["lm1b.tar.gz"]

    def never(*args, **kwargs):
        raise AssertionError("done again")

    for name in ("download", "extract"):
        monkeypatch.setattr(lm1b, name, never)
    monkeypatch.setattr(local_corpus, "_write_split", never)
    assert lm1b.prepare_lm1b(data_dir, source="http://unreachable.invalid/x.tar.gz") == corpus


def test_a_training_config_finds_the_prepared_corpus(archive, tmp_path, monkeypatch):
    """configs/bilm_large.py:DATA_DIR reads the text lm1b.prepare_lm1b prepared, without writing it again."""
    data_dir = str(tmp_path / "data")
    corpus = lm1b.prepare_lm1b(data_dir, source=archive)
    config = bilm_large.get_config(data_dir)
    assert (config.data.tfds_name, config.data.cache_dir) == ("", data_dir)
    monkeypatch.setattr(local_corpus, "_write_split", lambda *a, **k: pytest.fail("prepared again"))
    os.makedirs(tmp_path / "workdir")
    data = open_training_data(config.data, str(tmp_path / "workdir"))
    assert data.train.name == f"{corpus.name}[train]" and len(data.train) == len(expected_train())
    assert bilm_large.get_config().data.tfds_name == "lm1b"  # without a directory: TFDS's own lm1b


def test_an_archive_without_the_benchmark_files_is_refused(tmp_path):
    short = write_archive(tmp_path / "short.tar.gz", train_files=3)
    with pytest.raises(ValueError, match=r"found 3 training and 50 heldout text files .* expected 99 and 50"):
        lm1b.prepare_lm1b(tmp_path / "data", source=short)
    assert os.listdir(tmp_path / "data" / "lm1b") == []  # nothing extracted under a final name


def test_the_command_prepares_and_prints_the_training_flags(archive, tmp_path):
    result = run_command("elmo_jax.prepare_lm1b", f"--data_dir={tmp_path / 'd'}", f"--source={archive}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: 198 sentences in 1 shards" in result.stdout
    assert f"--config=configs/bilm_large.py:{tmp_path / 'd'}" in result.stdout
    error_line(run_in_process("elmo_jax.prepare_lm1b", f"--source={archive}"), "--data_dir is required")
    missing = tmp_path / "missing.tar.gz"
    error_line(
        run_in_process("elmo_jax.prepare_lm1b", f"--data_dir={tmp_path / 'e'}", f"--source=file://{missing}"),
        "missing.tar.gz",
    )


def test_a_broken_download_of_the_archive_resumes_from_its_part(archive, tmp_path, monkeypatch):
    """Every connection of the first run breaks (after 1,000 bytes, then 500 more twice): it fails with
    the network's error naming the 2,000 bytes kept; the next run asks only for the rest (`Range`)."""
    monkeypatch.setattr(download, "RETRY_PAUSE_S", 0.0)
    data, name, downloads = Path(archive).read_bytes(), "lm1b.tar.gz", tmp_path / "downloads"
    with FileServer({name: data}) as server:
        server.cut[name] = [1000, 500, 500]
        with pytest.raises(download.NetworkError, match=r"\(3 attempts\); 2,000 bytes are kept in \S+\.tar\.gz\.part"):
            lm1b.download(server.url + name, str(downloads))
        assert lm1b.download(server.url + name, str(downloads)) == str(downloads / name)
    assert [asked for _, asked in server.requests] == [None, "bytes=1000-", "bytes=1500-", "bytes=2000-"]
    assert (downloads / name).read_bytes() == data
    assert os.listdir(downloads) == [name]


def test_the_benchmark_archive_must_have_the_size_and_checksum_tfds_publishes(tmp_path, monkeypatch):
    """Under statmt.org's file name, a file of another size is refused before its bytes are written, and
    one of the size (here made the expected one) with other bytes after them; neither is kept."""
    fake = b"not the benchmark\n" * 100
    with FileServer({lm1b.ARCHIVE: fake}) as server:
        url = server.url + lm1b.ARCHIVE
        with pytest.raises(download.ServerError, match=f"has {len(fake):,} bytes, expected 1,792,209,805"):
            lm1b.download(url, str(tmp_path / "downloads"))
        monkeypatch.setattr(lm1b, "ARCHIVE_BYTES", len(fake))
        sha = r"SHA-256 [0-9a-f]{64}, expected 01ba60381110baf7f189dfd2b8374de371e8c9a340835793f190bdae9e90a34e"
        with pytest.raises(
            download.ServerError, match=rf"{sha} \(from TFDS's checksums, https://\S+/lm1b/checksums\.tsv\)"
        ):
            lm1b.download(url, str(tmp_path / "downloads"))
    assert os.listdir(tmp_path / "downloads") == []
