"""Random access to the sentences of a record source (an ArrayRecord data source, a TFDS data source):
`len(src)`, `src[i] -> str`, `src.__getitems__(ids)`, as the batch stream and grain read them."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence


class SentenceSource(Sequence):
    """Random access to the sentences of a record source: `len(src)`, `src[i] -> str`.

    Suits `grain.MapDataset.source(src)`. Indices follow Python: negative ones count from the end,
    anything outside [-len, len) raises IndexError, and a slice gives a list.

    Args:
      source: a random-access sequence of records (with `__getitems__` for batched reads, if it has one).
      name: names the source in errors.
      text_key: the feature holding the sentence when records are dicts (TFDS); None when each record
        is the sentence itself (UTF-8 bytes or str).
    """

    def __init__(self, source: Sequence, *, name: str, text_key: str | None = "text"):
        self._source, self._text_key, self.name = source, text_key, name
        self._length = len(source)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return self.__getitems__(range(*index.indices(self._length)))
        return self._text(self._source[self._check(index)])

    def __getitems__(self, indices: Sequence[int]) -> list[str]:
        """Several sentences in one read (ArrayRecord batches the lookups)."""
        keys = [self._check(i) for i in indices]
        getitems = getattr(self._source, "__getitems__", None)
        records = getitems(keys) if getitems else [self._source[k] for k in keys]
        return [self._text(record) for record in records]

    def __repr__(self) -> str:
        return f"SentenceSource({self.name}, {self._length} sentences)"

    def _check(self, index: int) -> int:
        index = operator.index(index)
        if not -self._length <= index < self._length:
            raise IndexError(f"sentence {index} is out of range for {self.name} ({self._length} sentences)")
        return index + self._length if index < 0 else index

    def _text(self, record) -> str:
        if self._text_key is not None:
            try:
                record = record[self._text_key]
            except (KeyError, TypeError, IndexError):
                found = sorted(record) if isinstance(record, Mapping) else type(record).__name__
                raise KeyError(f"{self.name}: records have no {self._text_key!r} feature; found {found}") from None
        return record.decode("utf-8") if isinstance(record, bytes) else str(record)
