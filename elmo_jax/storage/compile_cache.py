"""The persistent compilation cache: an XLA program compiled once is kept on disk, and the next process
that needs the same program reads it instead of compiling it again (a command run twice, a training run
resumed, the service restarted, a notebook's runtime restarted).

    compile_cache.use()            # every command (cli.run_main), Embedder, embed_sentences, training
    compile_cache.use("none")      # off for this process
    compile_cache.use("/scratch/xla")   # or gs://BUCKET/PATH (the gcs extra, docs/CLOUD_STORAGE.md)

Where (`directory`): the setting (a command's --compilation_cache, training's config.compilation_cache),
else $ELMO_JAX_COMPILATION_CACHE, else `compilation_cache` in the package's cache
(`cache_home.cache_dir()`: $ELMO_JAX_CACHE, else ~/.cache/elmo_jax); "none" turns it off ("off" and
the like are refused: `setting_problem`). docs/COMPILATION_CACHE.md has the figures. A cache the user
gave JAX itself (jax_compilation_cache_dir in jax.config, or $JAX_COMPILATION_CACHE_DIR) is kept, with
its thresholds, unless the setting names one: the library never overrides it.

What it holds is JAX's own (jax._src.compilation_cache, with JAX's keys): one file per program, keyed by
the program's StableHLO, the jaxlib version, the backend and its version, the devices' topology (the
device kind), the XLA flags and the compile options; a new jaxlib, another backend or another kind of
device computes other keys and never reads an entry written for the old. Every program is kept, however
quickly it compiled (`MIN_COMPILE_TIME_S`, measured below); JAX writes from process 0 only.

A cache that cannot be used is a warning, never a failure: a directory that cannot be created or written
(a file in its place, no permission, a full disk) is found before anything compiles and said in one
line, and the process compiles without it; an entry that cannot be read or written later (the disk
filled up) is said once, in one line, and JAX compiles that program as if there were no cache.
"""

from __future__ import annotations

import os
import re
import warnings

from absl import logging

from elmo_jax.storage import cache_home, places, publish

VARIABLE = "ELMO_JAX_COMPILATION_CACHE"
OFF = "none"
# Words a person may mean "off" by: refused rather than taken for a directory of that name.
_OTHER_OFF_WORDS = ("off", "false", "no", "0", "disable", "disabled", "null")
EXPECTED = "a directory, gs://BUCKET/PATH, or 'none' (to turn it off)"
FOLDER = "compilation_cache"  # under the package's cache
# JAX keeps a program only if it took this long to compile (its default: 1 s). On a 2-core CPU most of
# a command's programs compile in 20-60 ms (embed_text on the demo model: 48 of 49 programs; the biLM's
# own, 1.3 s), and reading them back beats compiling them again: warm runs of embed_text took 2.1-2.4
# CPU-s with every program kept (49 entries, 182 KiB), 3.3-3.5 with JAX's 1 s, 4.3-4.8 without a cache
# (docs/COMPILATION_CACHE.md).
MIN_COMPILE_TIME_S = 0.0
_PROBE = ".elmo_jax_writable"


def setting_problem(setting: object) -> str:
    """What a setting should have been when it cannot be one (`EXPECTED`), else "": a value that is no
    string, or that reads as "off" in another word than "none" (a directory called "off" is not what was
    meant). None and "" are the default."""
    if setting is None:
        return ""
    if not isinstance(setting, str) or setting.strip().lower() in _OTHER_OFF_WORDS:
        return EXPECTED
    return ""


def directory(setting: str | None = None) -> str | None:
    """The cache a setting names: `setting`, else $ELMO_JAX_COMPILATION_CACHE, else the default under the
    package's cache; None for "none" (off). A local path comes back absolute, `~` expanded.

    Raises:
      ValueError: the setting, or the variable, is not one (`setting_problem`).
    """
    for name, value in (("compilation cache", setting), (f"${VARIABLE}", os.environ.get(VARIABLE))):
        if problem := setting_problem(value):
            raise ValueError(f"{name}={value!r}: expected {problem}")
    chosen = (setting or "").strip() or os.environ.get(VARIABLE, "").strip()
    if not chosen:
        return os.path.join(cache_home.cache_dir(), FOLDER)
    if chosen.lower() == OFF:
        return None
    return places.absolute(places.expand_user(chosen))


def use(setting: str | None = None) -> str | None:
    """Turns the persistent compilation cache on for this process (before its first compile) and returns
    where it is (None: off).

    Args:
      setting: a directory or gs:// URL, "none", or None/"" for $ELMO_JAX_COMPILATION_CACHE or the default
        (see `directory`). A JAX cache the user set up is kept unless `setting` is given.

    A directory that cannot be used is a one-line warning and the cache is off (None); never an error.
    """
    import jax  # the cache is JAX's configuration: set here, before the first compile

    explicit = bool((setting or "").strip())
    if not explicit and (jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache):
        _say_entry_errors_once()  # the user's own cache (or JAX's turned off by the user): kept as it is
        return jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None
    chosen = directory(setting)
    if chosen is not None and not usable(chosen):
        chosen = None
    jax.config.update("jax_enable_compilation_cache", chosen is not None)
    if chosen is not None:
        jax.config.update("jax_compilation_cache_dir", chosen)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
        _say_entry_errors_once()
    return chosen


# directory -> whether it can be used: each is tried (and a failure said) once per process.
_TRIED: dict[str, bool] = {}


def usable(place: str) -> bool:
    """Whether the cache directory `place` can be used: it is created if missing, and a file is written
    into it and removed. Tried once per process; the first time it cannot, a warning line says why."""
    if place not in _TRIED:
        problem = _problem(place)
        if problem:
            logging.warning(
                "compilation cache %s cannot be used (%s); compiling without it (--compilation_cache, "
                "$%s or config.compilation_cache: another directory, or 'none')",
                place,
                problem,
                VARIABLE,
            )
        _TRIED[place] = not problem
    return _TRIED[place]


def _problem(place: str) -> str:
    """Why `place` cannot be used ("" when it can)."""
    if places.lexists(place) and not places.isdir(place):
        return "it is a file, not a directory"
    probe = places.join(place, f"{_PROBE}-{os.getpid()}")
    try:
        places.makedirs(place)
        publish.write_bytes(probe, b"")
        places.remove(probe)
    except OSError as e:  # no permission, a file on the way, a full disk, a bucket out of reach
        where = f" at {e.filename}" if e.filename and os.fspath(e.filename) != place else ""
        return f"{e.strerror or ' '.join(str(e).split())}{where}"
    return ""


class _FirstEntryError:
    """The message pattern of a `warnings` filter that says JAX's first "Error reading/writing
    persistent compilation cache entry" warning of a process in one line of its own and ignores the
    rest (JAX warns for every program it cannot store, each in two lines: hundreds once a disk is full)."""

    _JAX = re.compile(r"Error (reading|writing) persistent compilation cache entry")

    def __init__(self):
        self.said = False

    def match(self, text: str):
        if not self._JAX.match(text):
            return None
        if not self.said:
            self.said = True
            logging.warning(
                "compilation cache: %s (later errors of the cache are not shown; a program it cannot keep is "
                "compiled again next time)",
                " ".join(text.split()),
            )
        return True  # the filter's action, "ignore", applies


_ENTRY_ERRORS = _FirstEntryError()


def _say_entry_errors_once() -> None:
    """Installs the `_FirstEntryError` filter (again, where something reset the warning filters)."""
    if not any(entry[1] is _ENTRY_ERRORS for entry in warnings.filters):
        # Not `warnings.filterwarnings`, which takes a regular expression's text: any object with a
        # `match` method is a filter's message pattern to the warnings machinery.
        warnings.filters.insert(0, ("ignore", _ENTRY_ERRORS, UserWarning, None, 0))
