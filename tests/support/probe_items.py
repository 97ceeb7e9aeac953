"""Labelled targets for the probe and ablation tests: one-token items, and probe files of them."""

from __future__ import annotations

import json
from collections.abc import Iterable

from elmo_jax.analysis.probe_data import ProbeItem


def item(tokens: str, target: int, label: str) -> ProbeItem:
    """The token `target` of the space-separated `tokens`, labelled `label`, its word lowercased."""
    words = tuple(tokens.split())
    return ProbeItem(words, target, target + 1, label, words[target].lower())


def write_targets(path, items: Iterable[ProbeItem]) -> None:
    """`items` (one-token targets) as a JSON-lines probe file."""
    path.write_text(
        "".join(json.dumps({"tokens": list(i.tokens), "target": i.start, "label": i.label}) + "\n" for i in items),
        encoding="utf-8",
    )
