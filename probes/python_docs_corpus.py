"""A larger English training corpus for the layer probes: the prose of the Python documentation.

    python probes/python_docs_corpus.py --out_dir=/tmp/python_docs_corpus

Reads the reStructuredText sources of the Python 3.11 documentation as Debian installs them
(`apt-get install python3.11-doc`: /usr/share/doc/python3.11/html/_sources/**/*.rst.txt, 497 files,
about 1.4M words), drops code (literal blocks, doctests, directives and their bodies, tables, section
underlines), splits the rest into sentences with the default corpus's tokenizer and filters
(`elmo_jax.data.default_corpus.prose_sentences`), removes repeated sentences, and writes `train.txt` and
`heldout.txt` (1 sentence in 20 by a hash of its text), one tokenized sentence per line, plus
`manifest.json` with the counts. None of it comes from WordNet, the probe sets' source.

The output is a build product: never commit it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import sys

from absl import app, flags

from elmo_jax.data.default_corpus import HELDOUT_ONE_IN, prose_sentences
from elmo_jax.storage import atomic

FLAGS = flags.FLAGS
flags.DEFINE_string("sources", "/usr/share/doc/python3.11/html/_sources", "The documentation's reST sources.")
flags.DEFINE_string("out_dir", None, "Where train.txt, heldout.txt and manifest.json go.")

_DIRECTIVE = re.compile(r"^(\s*)\.\. [\w:-]+::")  # ".. code-block:: python", ".. note::", ...
_UNDERLINE = re.compile(r"^\s*([=\-~^\"'`#*+])\1{2,}\s*$")  # section titles' over/underlines
_TABLE = re.compile(r"^\s*[+|]")  # grid and simple table rows


def prose_of_rst(text: str) -> str:
    """reST with directive blocks (the directive line and its indented body), tables and section
    underlines removed; literal blocks and doctests are left to `prose_sentences`."""
    kept, skip_indent = [], None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if not line.strip() or indent > skip_indent:
                continue
            skip_indent = None
        directive = _DIRECTIVE.match(line)
        if directive:
            skip_indent = len(directive.group(1))
            kept.append("")
            continue
        if _UNDERLINE.match(line) or _TABLE.match(line):
            kept.append("")
            continue
        kept.append(line)
    return "\n".join(kept)


def main(argv) -> None:
    if len(argv) > 1 or not FLAGS.out_dir:
        sys.exit("usage: python probes/python_docs_corpus.py --out_dir=DIR [--sources=DIR]")
    files = sorted(glob.glob(os.path.join(FLAGS.sources, "**", "*.rst.txt"), recursive=True))
    if not files:
        sys.exit(f"error: no *.rst.txt under {FLAGS.sources} (apt-get install python3.11-doc)")
    seen, splits = set(), {"train": [], "heldout": []}
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = prose_of_rst(f.read())
        for tokens in prose_sentences(text):
            line = " ".join(tokens)
            if line in seen:
                continue
            seen.add(line)
            digest = hashlib.sha256(line.encode("utf-8")).digest()
            split = "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_ONE_IN == 0 else "train"
            splits[split].append(line)
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    manifest = {"sources": FLAGS.sources, "files": len(files)}
    for split, lines in splits.items():
        atomic.write_text(os.path.join(FLAGS.out_dir, f"{split}.txt"), "".join(x + "\n" for x in lines))
        tokens = [t for x in lines for t in x.split()]
        manifest[split] = {"sentences": len(lines), "tokens": len(tokens), "types": len(set(tokens))}
    atomic.write_text(os.path.join(FLAGS.out_dir, "manifest.json"), json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    app.run(main)
