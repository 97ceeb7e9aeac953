"""A second domain for the fine-tuning benchmark: English prose from text files other than the default
corpus's Python docstrings (by default the licence texts and copyright notices under /usr/share/doc on a
Debian or Ubuntu machine), split into sentences and tokenized like the default corpus.

    python bench/domain_text.py --files='/usr/share/doc/*/copyright' --out_dir=/tmp/legal
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elmo_jax.data.default_corpus import tokenize  # noqa: E402

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(]?[A-Z])")
_WORD = re.compile(r"[^\W\d_]{2,}")


def sentences_of(text: str):
    """Token lists of the prose sentences of a text: paragraphs split at blank lines (Debian's " ." lines
    count as blank), sentences at . ! ? before a capital; 6 to 60 tokens, at least 60% of them words."""
    lines = ["" if line.strip() in ("", ".") else line.strip() for line in text.splitlines()]
    for paragraph in "\n".join(lines).split("\n\n"):
        for sentence in _SENTENCE_END.split(" ".join(paragraph.split())):
            tokens = tokenize(sentence)
            if 6 <= len(tokens) <= 60 and sum(bool(_WORD.fullmatch(t)) for t in tokens) >= 0.6 * len(tokens):
                yield tokens


def write_domain(patterns: str, out_dir: str, heldout_one_in: int = 20, max_train: int = 30_000) -> dict:
    """Writes out_dir/train.txt and out_dir/heldout.txt (unique sentences, split by a hash of the text)."""
    seen, splits = set(), {"train": [], "heldout": []}
    for path in sorted(p for pattern in patterns.split(",") for p in glob.glob(pattern)):
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        for tokens in sentences_of(text):
            line = " ".join(tokens)
            if line in seen:
                continue
            seen.add(line)
            heldout = int(hashlib.sha256(line.encode()).hexdigest(), 16) % heldout_one_in == 0
            splits["heldout" if heldout else "train"].append(line)
    splits["train"] = splits["train"][:max_train]
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name, lines in splits.items():
        paths[name] = os.path.join(out_dir, f"{name}.txt")
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    return {name: (paths[name], len(lines), sum(len(s.split()) for s in lines)) for name, lines in splits.items()}


def main(argv):
    del argv
    for name, (path, n, tokens) in write_domain(flags.FLAGS.files, flags.FLAGS.out_dir).items():
        print(f"{name}: {n} sentences, {tokens} tokens -> {path}")


if __name__ == "__main__":
    flags.DEFINE_string("files", "/usr/share/doc/*/copyright", "Comma-separated globs of text files.")
    flags.DEFINE_string("out_dir", None, "Where train.txt and heldout.txt go.", required=True)
    app.run(main)
