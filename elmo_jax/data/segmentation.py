"""Word segmentation for text written without spaces (Chinese, Japanese): each line becomes its words
separated by single spaces, the form every reader of training text and sentences here takes (one
whitespace-tokenized sentence per line: `data.text_files`, `python -m elmo_jax.vocab`, `embed_file`).

    summary = segment_file("raw_zh.txt", "corpus_zh.txt", language="zh")   # python -m elmo_jax.segment

Text that already has spaces between its words (a corpus segmented elsewhere, or CoNLL-U tokens joined
by spaces) needs none of this: it is read as it is.

The segmenters are optional (the `segment` extra: `pip install -e '.[segment]'` in a clone;
docs/SEGMENTATION.md says why these):

  zh  rjieba: jieba's dictionary and algorithm (jieba-rs, in Rust), the dictionary inside the wheel.
  ja  SudachiPy with a SudachiDict package (core, else small, else full), split mode C (longest units).

Neither downloads anything when first used. The output has one line per input line, in order (line N of
the output is line N of the input, so sentences keep their numbers for `embed_file`); a blank line stays
blank, whitespace already in a line separates words as before, and a line is read by the one rule for
people's text files (`formats.text_lines`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterator

from elmo_jax import storage
from elmo_jax.formats.output_paths import Artifact, check_output
from elmo_jax.formats.text_lines import read_lines
from elmo_jax.runtime.progress import Progress

EXTRA = "segment"  # the package's extra that installs the segmenters
MAX_LINE_CHARS = 10_000  # the corpus reader's default bound on a line (data.text_files)


@dataclasses.dataclass(frozen=True)
class Segmenter:
    """How one language's text is cut into words.

    Attributes:
      language: the ISO 639-1 code (`--language`).
      name: the language, for messages.
      modules: the modules it needs, in the order to look for them (the first must be installed; for a
        dictionary package, one of the others).
      make: builds the cutting function (text -> words); called once per run.
    """

    language: str
    name: str
    modules: tuple[str, ...]
    make: Callable[[], Callable[[str], list[str]]]


def _jieba() -> Callable[[str], list[str]]:
    import rjieba

    return lambda text: rjieba.cut(text, hmm=True)


SUDACHI_DICTIONARIES = ("core", "small", "full")  # SudachiDict's editions, the one SudachiPy prefers first


def _sudachi() -> Callable[[str], list[str]]:
    from sudachipy import Dictionary, SplitMode

    edition = next(e for e in SUDACHI_DICTIONARIES if importlib.util.find_spec(f"sudachidict_{e}") is not None)
    tokenizer = Dictionary(dict=edition).tokenizer(mode=SplitMode.C, fields={"surface"})
    return lambda text: [m.surface() for m in tokenizer.tokenize(text)]


SEGMENTERS: dict[str, Segmenter] = {
    "zh": Segmenter("zh", "Chinese", ("rjieba",), _jieba),
    "ja": Segmenter("ja", "Japanese", ("sudachipy", *(f"sudachidict_{e}" for e in SUDACHI_DICTIONARIES)), _sudachi),
}


def find_segmenter(language: str, *, flag: str = "--language") -> Segmenter:
    """The segmenter of `language`, checked to be installed.

    Raises:
      ValueError: no segmenter for the language, or its packages are not installed (the message names
        `flag`, the packages and the extra that installs them).
    """
    segmenter = SEGMENTERS.get(language)
    if segmenter is None:
        raise ValueError(
            f"{flag}={language}: no segmenter for this language; the languages are {', '.join(SEGMENTERS)} "
            "(text with spaces between its words needs no segmenting)"
        )
    first, *dictionaries = segmenter.modules
    missing, packages = ([first], [first.lower()]) if importlib.util.find_spec(first) is None else ([], [])
    if dictionaries and not any(importlib.util.find_spec(m) is not None for m in dictionaries):
        missing.append(" or ".join(m.replace("_", "-") for m in dictionaries))
        packages.append(dictionaries[0].replace("_", "-"))
    if missing:
        # The PyPI packages, not `pip install 'elmo-jax[segment]'`: elmo-jax is not on PyPI (cli.check_installed).
        raise ValueError(
            f"{flag}={language} ({segmenter.name}) needs {' and '.join(missing)}, which is not installed: "
            f"pip install {' '.join(packages)} (the {EXTRA} extra)"
        )
    return segmenter


def segment_line(text: str, cut: Callable[[str], list[str]]) -> str:
    """The words of `text` (as `cut` finds them) separated by single spaces; whitespace in the text only
    separates words (it is never a word)."""
    return " ".join(w for part in text.split() for w in cut(part) if not w.isspace() and w)


def _is_text_file(path: str) -> bool:
    return storage.isfile(path)


SEGMENTED_TEXT = Artifact("a text file", is_directory=False, recognizes=_is_text_file)


def segment_file(
    input_path: str,
    output_path: str,
    *,
    language: str,
    overwrite: bool = False,
    log_every: int = 100_000,
) -> str:
    """Writes the text file `input_path` segmented into words to `output_path` (one line per line, whole
    or not at all: `storage.write_file`).

    Args:
      input_path: UTF-8 text, one sentence (or paragraph) per line; local or gs://.
      output_path: the segmented text; an existing file is replaced only with `overwrite`.
      language: a key of `SEGMENTERS`.
      overwrite: replace an existing `output_path` (a file; never the input).
      log_every: a progress line every this many lines.

    Returns:
      What `python -m elmo_jax.segment` prints: lines and words written.

    Raises:
      ValueError: an unknown language, the segmenter not installed, a line that is not UTF-8 or longer
        than `MAX_LINE_CHARS` (the message names the file and line); nothing is written.
      OSError: the input cannot be read or the output written (`output_paths.check_output`).
    """
    segmenter = find_segmenter(language)
    if not storage.isfile(input_path):
        if storage.isdir(input_path):
            raise IsADirectoryError(f"--input={input_path}: a directory, expected a text file")
        raise FileNotFoundError(f"--input={input_path}: no such file")
    check_output(output_path, SEGMENTED_TEXT, overwrite=overwrite, inputs=[input_path])
    cut = segmenter.make()
    counts = {"lines": 0, "words": 0}
    progress = Progress({"lines": None}, every=log_every, log=True)

    def write(f) -> None:
        for line in _segmented_lines(input_path, cut, counts, progress):
            f.write(line.encode("utf-8"))

    storage.write_file(output_path, write)
    return f"{input_path}: {counts['lines']:,} lines, {counts['words']:,} words ({segmenter.name}) -> {output_path}"


def _segmented_lines(path: str, cut, counts: dict, progress: Progress) -> Iterator[str]:
    for number, text in read_lines(path):
        if len(text) > MAX_LINE_CHARS:
            raise ValueError(
                f"{os.fspath(path)}:{number}: {len(text):,} characters, more than {MAX_LINE_CHARS:,} in one "
                "line (one sentence or paragraph per line is expected; split the line)"
            )
        line = segment_line(text, cut)
        counts["lines"] += 1
        counts["words"] += line.count(" ") + 1 if line else 0
        progress.add(lines=1)
        if progress.due():
            progress.write(f"segmented {counts['lines']:,} lines, {counts['words']:,} words")
        yield line + "\n"
