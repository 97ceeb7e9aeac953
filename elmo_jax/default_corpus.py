"""Build the embedded default corpus (Python standard library docstrings) into a directory.

    python -m elmo_jax.default_corpus OUT_DIR

Writes OUT_DIR/train.txt, heldout.txt (one tokenized sentence per line) and manifest.json, and prints
their counts; see `elmo_jax.data.default_corpus` for how the text is chosen and split.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from elmo_jax.data.default_corpus import build_default_corpus


def main(argv: Sequence[str]) -> None:
    if len(argv) != 2:
        print("usage: python -m elmo_jax.default_corpus OUT_DIR", file=sys.stderr)
        sys.exit(1)
    try:
        paths = build_default_corpus(argv[1])
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    with open(os.path.join(argv[1], "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    for name, path in zip(("train", "heldout"), paths):
        counts = manifest[name]
        print(f"{path}: {counts['sentences']} sentences, {counts['tokens']} tokens, {counts['types']} types")
    print(
        f"Python {manifest['python'].split()[0]}, {len(manifest['modules'])} modules "
        f"({len(manifest['missing_modules'])} missing), {manifest['source_files']} files, "
        f"built in {manifest['build_seconds']} s"
    )


def start() -> None:
    """The command: `elmo-default-corpus` (pyproject.toml's [project.scripts]) and
    `python -m elmo_jax.default_corpus`."""
    from elmo_jax import cli

    cli.start(main)


if __name__ == "__main__":
    start()
