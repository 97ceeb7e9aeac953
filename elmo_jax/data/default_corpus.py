"""A small English corpus built from the Python standard library, for training runs with no download.

    train_path, heldout_path = build_default_corpus("/tmp/elmo_corpus")

The text is the prose of a fixed list of standard-library modules (`MODULES`), read from their source
files with `ast` (nothing is imported): module, class and function docstrings, and full-line comment
blocks. It is split into sentences, tokenized with a small regex (words, dotted names and numbers stay
whole, every other symbol is its own token), cleaned of code-like sentences, de-duplicated, and written
one sentence per line (the 1B Word Benchmark format). A sentence goes to the heldout file when a hash
of its text says so (1 in `HELDOUT_ONE_IN`), so the split does not move when modules are added.

The exact text depends on the Python version that builds it (docstrings change between releases);
the module list only names modules present in 3.11, 3.12 and 3.13, and `manifest.json` records the
version, the modules read and the counts. Given the same Python and the same list, the output is the
same bytes. Python 3.11.7 gives about 0.31M training tokens in 20k sentences (14.7k types) and 16k
heldout tokens (its build time: bench/RESULTS.md, "Design figures"); the standard library simply holds
no more prose than that (its test suite would add 0.18M, but many installs, e.g. Debian's and the Docker
images, leave it out).

Generated files are build products: never commit them.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence

from elmo_jax.storage import atomic

FORMAT_VERSION = 1  # bump when the extraction or tokenization changes, so old builds are not reused
HELDOUT_ONE_IN = 20
MIN_TOKENS, MAX_TOKENS = 4, 80  # shorter "sentences" are mostly headings; longer ones, run-on lists
MIN_WORD_FRACTION = 0.6  # below this share of plain words a "sentence" is code or a table
NO_STOP_WORD_FRACTION = 0.8  # the same for a sentence that does not end in . ! ? or :

# Top-level modules and packages shipped in 3.11, 3.12 and 3.13, in sorted order. Left out: tests,
# IDLE, tkinter and turtledemo (often packaged separately), generated tables (encodings, stringprep,
# _sysconfigdata*), easter eggs (this, antigravity) and modules removed in 3.12 or 3.13.
MODULES = (
    "__future__",
    "_collections_abc",
    "_compat_pickle",
    "_compression",
    "_markupbase",
    "_osx_support",
    "_py_abc",
    "_pydecimal",
    "_pyio",
    "_sitebuiltins",
    "_strptime",
    "_threading_local",
    "_weakrefset",
    "abc",
    "argparse",
    "ast",
    "asyncio",
    "base64",
    "bdb",
    "bisect",
    "bz2",
    "cProfile",
    "calendar",
    "cmd",
    "code",
    "codecs",
    "codeop",
    "collections",
    "colorsys",
    "compileall",
    "concurrent",
    "configparser",
    "contextlib",
    "contextvars",
    "copy",
    "copyreg",
    "csv",
    "ctypes",
    "curses",
    "dataclasses",
    "datetime",
    "dbm",
    "decimal",
    "difflib",
    "dis",
    "doctest",
    "email",
    "enum",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "genericpath",
    "getopt",
    "getpass",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "http",
    "imaplib",
    "importlib",
    "inspect",
    "io",
    "ipaddress",
    "json",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "mimetypes",
    "modulefinder",
    "multiprocessing",
    "netrc",
    "ntpath",
    "nturl2path",
    "numbers",
    "opcode",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pdb",
    "pickle",
    "pickletools",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "posixpath",
    "pprint",
    "profile",
    "pstats",
    "pty",
    "py_compile",
    "pyclbr",
    "pydoc",
    "pydoc_data",
    "queue",
    "quopri",
    "random",
    "re",
    "reprlib",
    "rlcompleter",
    "runpy",
    "sched",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "site",
    "smtplib",
    "socket",
    "socketserver",
    "sqlite3",
    "sre_compile",
    "sre_constants",
    "sre_parse",
    "ssl",
    "stat",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "symtable",
    "sysconfig",
    "tabnanny",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "token",
    "tokenize",
    "tomllib",
    "trace",
    "traceback",
    "tracemalloc",
    "tty",
    "turtle",
    "types",
    "typing",
    "unittest",
    "urllib",
    "uuid",
    "venv",
    "warnings",
    "wave",
    "weakref",
    "webbrowser",
    "wsgiref",
    "xml",
    "xmlrpc",
    "zipapp",
    "zipfile",
    "zipimport",
    "zoneinfo",
)
_SKIP_DIRS = {"__pycache__", "test", "tests", "idle_test"}
# Modules whose long string constants (not only docstrings) are prose: pydoc's help topics, which
# hold most of the Language Reference as plain text.
_TEXT_MODULES = frozenset({os.path.join("pydoc_data", "topics.py")})
_MIN_TEXT_CONSTANT = 200  # characters; shorter constants in those modules are keys and titles

_TOKEN_RE = re.compile(r"\w+(?:[.'’\-]\w+)*|[^\w\s]")
_WORD_RE = re.compile(r"[^\W\d_]+(?:['’\-][^\W\d_]+)*")  # letters, with inner ' or -
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
_ROLE_RE = re.compile(r":[\w:.-]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`os.path.join` -> os.path.join
_LITERAL_RE = re.compile(r"``([^`]*)``|`([^`]*)`")
_CODE_MARKS = frozenset("={}\\#$@|<>")


def tokenize(text: str) -> list[str]:
    """Words, dotted names and numbers as single tokens; every other non-space character alone."""
    return _TOKEN_RE.findall(text)


def prose_sentences(text: str) -> Iterator[list[str]]:
    """The sentences of reST-like prose (a docstring, a documentation page) that read as prose, tokenized
    as the default corpus is: literal blocks, doctests and directives dropped, inline markup removed."""
    for paragraph in _paragraphs(text):
        yield from _sentences(paragraph)


def build_default_corpus(out_dir: str | os.PathLike, *, modules: Sequence[str] = MODULES) -> tuple[str, str]:
    """Writes (or reuses) `train.txt`, `heldout.txt` and `manifest.json` in `out_dir`.

    Args:
      out_dir: created if missing. Files are written atomically, the manifest last; an existing build
        whose manifest matches this Python, module list and format is reused without rereading.
      modules: the top-level modules and packages to read, in this order (e.g. `MODULES[:3]` for a
        quick build); names without source in this Python are skipped and listed in the manifest.

    Returns:
      (train_path, heldout_path).
    """
    start = time.perf_counter()
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    stdlib = sysconfig.get_paths()["stdlib"]
    sources, missing = _source_files(stdlib, modules)
    if not sources:
        raise FileNotFoundError(f"none of the modules {list(modules)} has source under {stdlib}")
    key = _fingerprint(stdlib, modules, sources)
    paths = {name: os.path.join(out_dir, f"{name}.txt") for name in ("train", "heldout")}
    manifest_path = os.path.join(out_dir, "manifest.json")
    if _is_built(manifest_path, key, paths):
        return paths["train"], paths["heldout"]
    if os.path.exists(manifest_path):
        os.remove(manifest_path)  # the data files are about to change; the old manifest must not vouch for them
    splits = _split(_unique_sentences(stdlib, sources))
    manifest = {
        "fingerprint": key,
        "format_version": FORMAT_VERSION,
        "python": sys.version,
        "modules": list(modules),
        "missing_modules": missing,
        "source_files": len(sources),
        "heldout_one_in": HELDOUT_ONE_IN,
    }
    for name, sentences in splits.items():
        text = "".join(" ".join(tokens) + "\n" for tokens in sentences)
        atomic.write_text(paths[name], text)
        manifest[name] = {
            "sentences": len(sentences),
            "tokens": sum(map(len, sentences)),
            "types": len({token for tokens in sentences for token in tokens}),
            "bytes": len(text.encode("utf-8")),
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        }
    manifest["build_seconds"] = round(time.perf_counter() - start, 2)
    atomic.write_text(manifest_path, json.dumps(manifest, indent=1) + "\n")
    return paths["train"], paths["heldout"]


def _source_files(stdlib: str, modules: Sequence[str]) -> tuple[list[str], list[str]]:
    """Relative paths of the modules' .py files (packages walked in sorted order), and missing modules."""
    found, missing = [], []
    for module in modules:
        package = os.path.join(stdlib, module)
        if os.path.isfile(os.path.join(package, "__init__.py")):
            for root, dirs, files in os.walk(package):
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
                found += [os.path.relpath(os.path.join(root, f), stdlib) for f in sorted(files) if f.endswith(".py")]
        elif os.path.isfile(package + ".py"):
            found.append(module + ".py")
        else:
            missing.append(module)
    return found, missing


def _fingerprint(stdlib: str, modules: Sequence[str], sources: Sequence[str]) -> str:
    """Hash of what decides the output: format, Python version, modules, each source file's path and size."""
    sizes = [[path, os.path.getsize(os.path.join(stdlib, path))] for path in sources]
    key = {
        "format": FORMAT_VERSION,
        "python": sys.version,
        "heldout_one_in": HELDOUT_ONE_IN,
        "modules": list(modules),
        "sources": sizes,
    }
    return hashlib.sha256(json.dumps(key).encode("utf-8")).hexdigest()


def _is_built(manifest_path: str, key: str, paths: dict[str, str]) -> bool:
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        return manifest["fingerprint"] == key and all(
            os.path.getsize(path) == manifest[name]["bytes"] for name, path in paths.items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _unique_sentences(stdlib: str, sources: Sequence[str]) -> Iterator[list[str]]:
    """Sentences in source order, each distinct text once (docstrings repeat a lot across classes)."""
    seen: set[str] = set()
    for path in sources:
        with open(os.path.join(stdlib, path), "rb") as f:
            source = f.read()
        for text in _prose_of(source, all_strings=path in _TEXT_MODULES):
            for tokens in prose_sentences(text):
                line = " ".join(tokens)
                if line not in seen:
                    seen.add(line)
                    yield tokens


def _split(sentences: Iterator[list[str]]) -> dict[str, list[list[str]]]:
    splits: dict[str, list[list[str]]] = {"train": [], "heldout": []}
    for tokens in sentences:
        digest = hashlib.sha256(" ".join(tokens).encode("utf-8")).digest()
        name = "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_ONE_IN == 0 else "train"
        splits[name].append(tokens)
    return splits


def _prose_of(source: bytes, all_strings: bool = False) -> list[str]:
    """Docstrings and full-line comment blocks of one module, in line order.

    With `all_strings`, every string constant of at least `_MIN_TEXT_CONSTANT` characters counts too.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a file this Python cannot parse contributes nothing
        return []
    found: list[tuple[int, str]] = []
    in_string: set[int] = set()  # lines inside multi-line strings, where "#" does not start a comment
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                found.append((node.body[0].lineno, doc))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.end_lineno > node.lineno:
                in_string.update(range(node.lineno + 1, node.end_lineno + 1))
            if all_strings and len(node.value) >= _MIN_TEXT_CONSTANT:
                found.append((node.lineno, node.value))
    found += _comment_blocks(source.decode("utf-8", errors="replace").splitlines(), in_string)
    return [text for _, text in sorted(found, key=lambda item: item[0])]


def _comment_blocks(lines: list[str], in_string: set[int]) -> list[tuple[int, str]]:
    """Runs of full-line "#" comments, "#" removed; a blank "#" line separates paragraphs."""
    blocks, current, first = [], [], 0
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped.startswith("#") and number not in in_string and not stripped.startswith(("#!", "#-*-")):
            if not current:
                first = number
            current.append(stripped.lstrip("#").strip())
            continue
        if current:
            blocks.append((first, "\n".join(current)))
            current = []
    if current:
        blocks.append((first, "\n".join(current)))
    return blocks


def _paragraphs(text: str) -> Iterator[str]:
    """Blank-line separated paragraphs of a docstring or comment, without code blocks and markup."""
    lines, code_indent, in_doctest = [], None, False
    for line in text.splitlines() + [""]:
        stripped, indent = line.strip(), len(line) - len(line.lstrip())
        if code_indent is not None and (not stripped or indent > code_indent):
            continue  # inside a "::" literal block
        code_indent = None
        if stripped.startswith((">>>", "...")):
            in_doctest = True
        if in_doctest:
            in_doctest = bool(stripped)  # doctest output runs until a blank line
            continue
        if not stripped or stripped.startswith(".."):  # paragraph break, or an reST directive
            if lines:
                yield _strip_markup(" ".join(lines))
            lines = []
            continue
        if stripped.endswith("::"):
            code_indent = indent
            stripped = stripped[:-1]
        lines.append(stripped)


def _strip_markup(paragraph: str) -> str:
    paragraph = _ROLE_RE.sub(r"\1", paragraph)
    return _LITERAL_RE.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), paragraph)


def _sentences(paragraph: str) -> Iterator[list[str]]:
    """Token lists of the paragraph's sentences that read as prose."""
    for sentence in _SENTENCE_END_RE.split(paragraph):
        tokens = tokenize(sentence)
        if not MIN_TOKENS <= len(tokens) <= MAX_TOKENS or _CODE_MARKS.intersection(tokens):
            continue
        words = sum(1 for token in tokens if _WORD_RE.fullmatch(token))
        # Comments often end without a full stop; without one, ask for more plain words.
        needed = MIN_WORD_FRACTION if tokens[-1] in (".", "!", "?", ":") else NO_STOP_WORD_FRACTION
        if words >= needed * len(tokens):
            yield tokens
