"""The line rules of a text corpus applied one line at a time to a whole file's bytes, written from the
rules `elmo_jax/data/text_files.py` documents (bilm-tf's `line.strip().split()`, every skipped line
counted), for the tests to compare elmo_jax's block reader with. It shares no code with elmo_jax.
"""

from __future__ import annotations

KINDS = (
    "bom_files",
    "empty_files",
    "long_lines",
    "invalid_utf8_replaced",
    "invalid_utf8_skipped",
    "blank_lines",
    "nul_lines",
    "reserved_tokens",
)


def read_lines(data: bytes, path: str, max_line_chars, invalid_utf8: str, reserved=(), kept: int = 5):
    """(records, counts, examples) of one file holding `data`.

    records: list of bytes, each kept line's tokens joined by single spaces (UTF-8).
    counts: kind -> count, plus "lines", "sentences" and "tokens".
    examples: kind -> the first `kept` places ("path:line", or "path" for the file-level kinds).
    """
    counts = dict.fromkeys(KINDS + ("lines", "sentences", "tokens"), 0)
    examples: dict[str, list[str]] = {}

    def note(kind, place, count=1):
        counts[kind] += count
        places = examples.setdefault(kind, [])
        if len(places) < kept:
            places.append(place)

    if data.startswith(b"\xef\xbb\xbf"):
        note("bom_files", path)
        data = data[3:]
        lines = data.split(b"\n") if data else [b""]  # the mark alone is a first line, blank
    else:
        lines = data.split(b"\n") if data else []
    if data.endswith(b"\n"):
        lines.pop()
    if not lines:
        note("empty_files", path)
    records = []
    for number, raw in enumerate(lines, 1):
        counts["lines"] += 1
        place = f"{path}:{number}"
        if max_line_chars is not None and len(raw) >= 4 * max_line_chars + 5:
            note("long_lines", place)
            continue
        try:
            text, replaced = raw.decode("utf-8"), False
        except UnicodeDecodeError:
            if invalid_utf8 == "skip":
                note("invalid_utf8_skipped", place)
                continue
            text, replaced = raw.decode("utf-8", "replace"), True
        text = text.rstrip("\r\n")
        if max_line_chars is not None and len(text) > max_line_chars:
            note("long_lines", place)
            continue
        tokens = text.split()
        if not tokens:
            note("blank_lines", place)
            continue
        if replaced:
            note("invalid_utf8_replaced", place)
        if "\x00" in text:
            note("nul_lines", place)
        hits = sum(token in reserved for token in tokens)
        if hits:
            note("reserved_tokens", place, hits)
        counts["sentences"] += 1
        counts["tokens"] += len(tokens)
        records.append(" ".join(tokens).encode("utf-8"))
    return records, counts, examples
