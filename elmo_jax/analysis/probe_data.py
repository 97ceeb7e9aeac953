"""Labelled probe targets: what `elmo_jax.probe` reads.

Two formats, chosen by the file name:

- JSON lines (`*.jsonl`), one target per line:
  `{"tokens": ["the", "bank", "of", "the", "river"], "target": 1, "label": "bank.n.01"}`.
  `target` is a token index, or `[start, end)` for a span (its vector is the mean of the span's tokens);
  an optional `"word"` names the target's word for the per-word baseline and the nearest-neighbour
  search (default: the target's tokens, lowercased, joined by spaces).
- CoNLL-style tagging files (any other name): one `TOKEN<TAB>LABEL` per line (whitespace also separates
  them when there is no tab; extra columns after the label are ignored), sentences separated by blank
  lines; every token is a target.

Errors name the file and line (1-based) and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import os

from elmo_jax import storage
from elmo_jax.formats.text_lines import read_lines


@dataclasses.dataclass(frozen=True)
class ProbeItem:
    """One labelled target.

    Attributes:
      tokens: the sentence.
      start, end: the target's token span [start, end).
      label: the class to predict.
      word: the target's word (what the per-word baseline and the nearest-neighbour search key on).
    """

    tokens: tuple[str, ...]
    start: int
    end: int
    label: str
    word: str


def read_probe_file(path: str | os.PathLike) -> list[ProbeItem]:
    """The items of a probe file (format by name: `.jsonl` or CoNLL). Raises ValueError / OSError naming
    the file (and line) for a missing, empty or malformed file."""
    path = os.fspath(path)
    if storage.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, expected a probe file (.jsonl or CoNLL)")
    if not storage.exists(path):
        raise FileNotFoundError(f"{path}: probe file not found")
    lines = [text for _, text in read_lines(path)]  # the text-file rule: a BOM at the start, "\r\n" line ends
    items = _read_jsonl(path, lines) if path.endswith(".jsonl") else _read_conll(path, lines)
    if not items:
        raise ValueError(f"{path}: no probe items (an empty file?)")
    return items


def _read_jsonl(path: str, lines: list[str]) -> list[ProbeItem]:
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{where}: not a JSON object ({e})") from None
        if not isinstance(record, dict) or not {"tokens", "target", "label"} <= set(record):
            raise ValueError(f'{where}: expected an object with "tokens", "target" and "label"')
        tokens, target, label = record["tokens"], record["target"], record["label"]
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
            raise ValueError(f'{where}: "tokens" must be a non-empty list of non-empty strings')
        start, end = _span(target, len(tokens), where)
        if not isinstance(label, (str, int)) or isinstance(label, bool):
            raise ValueError(f'{where}: "label" must be a string, found {label!r}')
        word = record.get("word", " ".join(tokens[start:end]).lower())
        items.append(ProbeItem(tuple(tokens), start, end, str(label), str(word)))
    return items


def _span(target, n_tokens: int, where: str) -> tuple[int, int]:
    if isinstance(target, int) and not isinstance(target, bool):
        start, end = target, target + 1
    elif (
        isinstance(target, list)
        and len(target) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in target)
    ):
        start, end = target
    else:
        raise ValueError(f'{where}: "target" must be a token index or a [start, end) pair, found {target!r}')
    if not 0 <= start < end <= n_tokens:
        raise ValueError(f'{where}: "target" {target!r} is outside its sentence of {n_tokens} tokens')
    return start, end


def _read_conll(path: str, lines: list[str]) -> list[ProbeItem]:
    sentences, current = [], []
    for number, line in enumerate(lines + [""], start=1):
        if not line.strip():
            if current:
                sentences.append(current)
            current = []
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
            raise ValueError(f"{path}:{number}: expected TOKEN<TAB>LABEL, found {line!r}")
        current.append((fields[0].strip(), fields[1].strip()))
    items = []
    for sentence in sentences:
        tokens = tuple(token for token, _ in sentence)
        items += [ProbeItem(tokens, i, i + 1, label, token.lower()) for i, (token, label) in enumerate(sentence)]
    return items
