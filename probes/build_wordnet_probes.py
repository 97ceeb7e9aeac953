"""Build the two probe sets of `probes/wordnet/` from WordNet 3.0's usage examples.

    apt-get install wordnet-base        # Debian's package of the WordNet 3.0 database
    python probes/build_wordnet_probes.py --wordnet=/usr/share/wordnet --out_dir=probes/wordnet

WordNet glosses carry usage examples in quotes ("they pulled the canoe up on the bank"), each written
for one sense of one word. An example becomes a probe item when the word (or an inflection of it,
found with WordNet's morphology rules and exception lists) occurs in it exactly once:

- `pos.{train,test}.jsonl`: words whose spelling is used both as a noun and as a verb (bank, run,
  walk, ...); the label is NOUN or VERB, the part of speech of the sense the example illustrates.
- `wsd.{train,test}.jsonl`: nouns, verbs, adjectives and adverbs with at least two senses that have
  two usable examples or more (so a sense can be learnt from one and tested on another); the label is
  the sense, `word.pos.NN` with NN the sense's rank in WordNet's index (01 most frequent).

At most `--max_items` items per probe are kept, whole words at a time (all of a word's examples or
none), chosen in a fixed pseudo-random order of the words.

Items are split by sentence (a hash of the example's text: 1 in 4 goes to test), so no sentence is in
both files; a test item whose label no training item has is dropped (nothing could learn it). Each
line: {"tokens": [...], "target": i, "label": ..., "word": lemma}, tokenized with the default corpus's
tokenizer. The output is deterministic for a given WordNet. WordNet's licence is
copied next to the files (`LICENSE.WordNet`): it allows redistribution with its notice.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import shutil
import sys

from absl import app, flags

from elmo_jax.data.default_corpus import tokenize

FLAGS = flags.FLAGS
flags.DEFINE_string("wordnet", "/usr/share/wordnet", "WordNet 3.0 dict directory (data.noun, index.noun, ...).")
flags.DEFINE_string("license", "/usr/share/doc/wordnet-base/copyright", "WordNet's licence text to copy.")
flags.DEFINE_string("out_dir", "probes/wordnet", "Where the .jsonl files go.")
flags.DEFINE_integer("max_items", 6000, "At most this many items per probe set (a deterministic subset).")

POS_NAMES = {"n": "NOUN", "v": "VERB"}  # the POS probe's labels
FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}  # WordNet's file suffix of each part of speech
TEST_ONE_IN = 4
_EXAMPLE = re.compile(r'"([^"]+)"')
# WordNet's detachment rules (morphy): suffix -> replacement, per part of speech.
_RULES = {
    "n": [
        ("s", ""),
        ("ses", "s"),
        ("xes", "x"),
        ("zes", "z"),
        ("ches", "ch"),
        ("shes", "sh"),
        ("men", "man"),
        ("ies", "y"),
    ],
    "v": [("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")],
    "a": [("er", ""), ("est", ""), ("er", "e"), ("est", "e")],
    "r": [],
}


def read_synsets(wordnet: str, pos: str) -> dict[str, tuple[list[str], list[str]]]:
    """offset -> (single-word lemmas, usage examples) of one part of speech's data file."""
    synsets = {}
    with open(os.path.join(wordnet, f"data.{FILES[pos]}"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("  "):  # the licence header
                continue
            fields, _, gloss = line.partition(" | ")
            parts = fields.split()
            offset, count = parts[0], int(parts[3], 16)
            words = [parts[4 + 2 * i].lower() for i in range(count)]
            lemmas = [w for w in words if re.fullmatch(r"[a-z]+", w)]
            synsets[offset] = (lemmas, _EXAMPLE.findall(gloss))
    return synsets


def read_index(wordnet: str, pos: str) -> dict[str, list[str]]:
    """lemma -> its synset offsets in sense order (most frequent first)."""
    senses = {}
    with open(os.path.join(wordnet, f"index.{FILES[pos]}"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("  "):
                continue
            parts = line.split()
            lemma, synset_count, pointer_count = parts[0], int(parts[2]), int(parts[3])
            senses[lemma] = parts[6 + pointer_count : 6 + pointer_count + synset_count]
    return senses


def read_exceptions(wordnet: str, pos: str) -> dict[str, set[str]]:
    """inflected form -> base forms, from WordNet's exception list (e.g. ran -> run)."""
    exceptions = collections.defaultdict(set)
    with open(os.path.join(wordnet, f"{FILES[pos]}.exc"), encoding="utf-8") as f:
        for line in f:
            inflected, *bases = line.split()
            exceptions[inflected].update(bases)
    return exceptions


def base_forms(token: str, pos: str, exceptions: dict[str, set[str]]) -> set[str]:
    """The lemmas a token may be an inflection of (itself included)."""
    token = token.lower()
    forms = {token} | exceptions.get(token, set())
    for suffix, replacement in _RULES[pos]:
        if token.endswith(suffix) and len(token) > len(suffix) + 1:
            stem = token[: -len(suffix)] + replacement
            forms.add(stem)
            if pos == "v" and replacement == "" and len(stem) > 2 and stem[-1] == stem[-2]:
                forms.add(stem[:-1])  # running -> runn -> run, stopped -> stopp -> stop
    return forms


def items_for(wordnet: str) -> dict[str, list[dict]]:
    """{"pos": [...], "wsd": [...]}: every usable (example, word) pair of each probe."""
    synsets = {pos: read_synsets(wordnet, pos) for pos in FILES}
    index = {pos: read_index(wordnet, pos) for pos in FILES}
    exceptions = {pos: read_exceptions(wordnet, pos) for pos in FILES}
    both = set(index["n"]) & set(index["v"])
    found = collections.defaultdict(list)  # (pos, lemma) -> [(sense rank, tokens, target)]
    for pos in FILES:
        for lemma, offsets in index[pos].items():
            if not re.fullmatch(r"[a-z]+", lemma):
                continue
            for rank, offset in enumerate(offsets, start=1):
                for example in synsets[pos][offset][1]:
                    tokens = tokenize(example)
                    hits = [i for i, t in enumerate(tokens) if lemma in base_forms(t, pos, exceptions[pos])]
                    if len(hits) == 1:
                        found[pos, lemma].append((rank, tokens, hits[0]))
    probes = {"pos": [], "wsd": []}
    for (pos, lemma), examples in sorted(found.items()):
        if lemma in both and pos in POS_NAMES:
            probes["pos"] += [_item(tokens, target, POS_NAMES[pos], lemma) for _, tokens, target in examples]
        # A sense needs two examples or more to be learnable from one and tested on another.
        per_sense = collections.Counter(rank for rank, _, _ in examples)
        kept = [(rank, tokens, target) for rank, tokens, target in examples if per_sense[rank] >= 2]
        if len({rank for rank, _, _ in kept}) >= 2:
            probes["wsd"] += [
                _item(tokens, target, f"{lemma}.{pos}.{rank:02d}", lemma) for rank, tokens, target in kept
            ]
    return probes


def _item(tokens: list[str], target: int, label: str, word: str) -> dict:
    return {"tokens": tokens, "target": target, "label": label, "word": word}


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def write(items: list[dict], out_dir: str, name: str, max_items: int) -> dict[str, int]:
    """Keeps at most `max_items` (whole words, in a deterministic order, so each kept word keeps all its
    examples), splits them by sentence and writes train and test."""
    by_word = collections.defaultdict(list)
    for item in items:
        by_word[item["word"]].append(item)
    items = []
    for word in sorted(by_word, key=lambda w: (_digest(w), w)):
        if len(items) + len(by_word[word]) > max_items:
            continue
        items += by_word[word]
    counts = {}
    splits = {
        split: [item for item in items if (_digest(" ".join(item["tokens"])) % TEST_ONE_IN == 0) == (split == "test")]
        for split in ("train", "test")
    }
    # A label no training item has cannot be learnt (and the probe refuses it): such test items are dropped.
    known = {item["label"] for item in splits["train"]}
    splits["test"] = [item for item in splits["test"] if item["label"] in known]
    for split, chosen in splits.items():
        chosen.sort(key=lambda item: (item["word"], item["label"], item["tokens"]))
        with open(os.path.join(out_dir, f"{name}.{split}.jsonl"), "w", encoding="utf-8") as f:
            for item in chosen:
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
        counts[split] = len(chosen)
    return counts


def main(argv) -> None:
    if len(argv) > 1:
        sys.exit(f"unexpected arguments {argv[1:]}")
    if not os.path.exists(os.path.join(FLAGS.wordnet, "data.noun")):
        sys.exit(f"error: no WordNet database in {FLAGS.wordnet} (apt-get install wordnet-base)")
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    probes = items_for(FLAGS.wordnet)
    for name, items in probes.items():
        counts = write(items, FLAGS.out_dir, name, FLAGS.max_items)
        labels = len({item["label"] for item in items})
        print(
            f"{name}: {len(items)} items found ({labels} labels), kept {counts['train']} train + {counts['test']} test"
        )
    shutil.copyfile(FLAGS.license, os.path.join(FLAGS.out_dir, "LICENSE.WordNet"))


if __name__ == "__main__":
    app.run(main)
