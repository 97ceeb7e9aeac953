"""A stand-in for statmt.org's 1B Word Benchmark archive: 99 training and 50 heldout files of a few lines
each, laid out as in the real one, plus files that must not be extracted."""

from __future__ import annotations

import io
import tarfile

from elmo_jax.data import lm1b

TOP = lm1b.TOP_DIR
MTIME = 1_300_000_000  # the archive's files are from 2011


def train_lines(i: int) -> list[str]:
    return [f"sentence {i} of the  training file .", f"another {i} ."]


def heldout_lines(i: int) -> list[str]:
    return [f"heldout {i} ."]


def write_archive(path, train_files: int = 99, heldout_files: int = 50) -> str:
    members = {f"{TOP}/README": "not a split\n", "evil/../../outside.txt": "never extracted\n"}
    for i in range(1, train_files + 1):
        members[f"{TOP}/{lm1b.TRAIN_DIR}/news.en-{i:05d}-of-00100"] = "\n".join(train_lines(i)) + "\n"
    for i in range(heldout_files):
        members[f"{TOP}/{lm1b.HELDOUT_DIR}/news.en.heldout-{i:05d}-of-00050"] = "\n".join(heldout_lines(i)) + "\n"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            data = text.encode("utf-8")
            info.size, info.mtime = len(data), MTIME
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def expected_train() -> list[str]:
    return [" ".join(line.split()) for i in range(1, 100) for line in train_lines(i)]
