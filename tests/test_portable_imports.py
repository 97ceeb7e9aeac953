"""The package on Windows (issue #51, item 6): JAX's CPU wheels install there, and the package failed as
soon as it was used (`import elmo_jax` imports its names on first use) on the POSIX-only modules imported
at module level: `fcntl` in formats/download.py and storage/lock.py, `resource` in
formats/vectors_hdf5.py and serving/service.py.

No Windows machine runs this suite, so Windows is simulated as far as CPython lets a Linux process: the
POSIX-only modules made unimportable and the POSIX-only `os` names deleted. What only Windows has
(`msvcrt.locking`, a directory that cannot be opened as a file) is checked against a stand-in.
"""

from __future__ import annotations

import ast
import errno
import logging
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from elmo_jax.formats import download, vectors_hdf5
from elmo_jax.serving import service
from elmo_jax.storage import lock
from tests.support.commands import REPO, command_env

PACKAGE = REPO / "elmo_jax"
POSIX_MODULES = ("fcntl", "resource", "termios")  # what the package used, or a terminal library would
POSIX_OS_NAMES = ("O_NOFOLLOW", "O_NONBLOCK", "pread", "pwrite")  # os names absent on Windows it used

# One process as Windows has it, as far as CPython lets Linux pretend: imports the package, embeds two of
# the AllenNLP fixture's sentences (checked against AllenNLP's activations, 1e-5 as test_embedder), takes
# and releases a workdir lock (no lock call left: it runs unlocked, saying so), refuses a link at a lock
# path without O_NOFOLLOW, and takes and releases the download lock on a file and on a directory.
SIMULATED_WINDOWS = f"""
import json, os, sys
for module in {POSIX_MODULES!r}:
    sys.modules[module] = None  # `import fcntl` now raises ImportError, as on Windows
for name in {POSIX_OS_NAMES!r}:
    delattr(os, name)
import numpy as np
import elmo_jax
from elmo_jax import storage
from elmo_jax.formats import download

fixture, tmp = sys.argv[1], sys.argv[2]
with open(os.path.join(fixture, "sentences.json"), encoding="utf-8") as f:
    sentences = json.load(f)["main"][:2]
activations = np.load(os.path.join(fixture, "main.npz"))["activations"]
options, weights = os.path.join(fixture, "options.json"), os.path.join(fixture, "weights.hdf5")
embedder = elmo_jax.Embedder(options, weights, cuda_device=0)
for b, vectors in enumerate(embedder.embed_batch(sentences)):
    np.testing.assert_allclose(vectors, activations[:, b, : len(sentences[b])], rtol=0, atol=1e-5)


def place_lock(directory):
    return storage.PlaceLock(
        directory, name=".lock", holder={{"pid": os.getpid()}}, describe=str, refused=RuntimeError,
        moved=RuntimeError, what="the test directory",
    )


with place_lock(tmp):
    pass
linked = os.path.join(tmp, "linked")
os.mkdir(linked)
os.symlink(os.path.join(tmp, "precious"), os.path.join(linked, ".lock"))
try:
    place_lock(linked).acquire()
    raise AssertionError("a link at the lock path was followed")
except OSError as e:
    assert "is a symbolic link" in str(e) and not os.path.exists(os.path.join(tmp, "precious")), e
with download.locked(os.path.join(tmp, "download.lock")):
    with download.locked(os.path.join(tmp, "linked")):
        pass
print("embedded, locked and released")
"""


def test_the_package_imports_embeds_and_locks_without_the_posix_modules(fixture_dir, tmp_path):
    """Before: `ModuleNotFoundError: import of fcntl halted` (storage/lock.py, through elmo_jax.storage
    when the Embedder was built)."""
    result = subprocess.run(
        [sys.executable, "-c", SIMULATED_WINDOWS, str(fixture_dir), str(tmp_path)],
        cwd=REPO,
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1:] == ["embedded, locked and released"], result.stdout
    assert "this file system has no locks" in result.stderr  # the workdir lock's one policy without locks


def _module_level_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of the imports outside any function: what runs when the module is imported."""
    found, pending = [], list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module.split(".")[0]))
        pending += list(ast.iter_child_nodes(node))
    return found


# Names of the os module that Windows' Python 3.11 lacks: read through getattr(os, NAME, default).
WINDOWS_LACKS = {
    *POSIX_OS_NAMES,
    *("O_DIRECTORY", "O_CLOEXEC", "getuid", "geteuid", "getgid", "getegid", "fchmod", "fchown", "getpgid"),
    *("killpg", "setsid", "mkfifo", "statvfs", "fstatvfs", "sync", "uname", "getloadavg", "fork", "WNOHANG"),
    *("sched_getaffinity", "posix_fallocate"),
}


def test_no_module_imports_a_single_platform_module_or_uses_a_posix_only_os_name():
    """The whole package, read with `ast` (the process above imports only what embedding needs): no
    import of fcntl, resource, termios or msvcrt outside a function, and no `os.NAME` that Windows lacks.
    Before: download.py, lock.py, vectors_hdf5.py and service.py imported them; lock.py and sync.py named
    os.O_NOFOLLOW and os.O_NONBLOCK, lock.py os.pread and os.pwrite."""
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(REPO).as_posix()
        problems += [
            f"{where}:{line} imports {module}"
            for line, module in _module_level_imports(tree)
            if module in (*POSIX_MODULES, "msvcrt")
        ]
        problems += [
            f"{where}:{node.lineno} uses os.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in WINDOWS_LACKS
        ]
    assert problems == []


@pytest.fixture
def without_lock_calls(monkeypatch):
    """Neither fcntl nor msvcrt importable: no lock call at all (a platform with neither)."""
    monkeypatch.setitem(sys.modules, "fcntl", None)
    monkeypatch.setitem(sys.modules, "msvcrt", None)


def _place_lock(directory: Path) -> lock.PlaceLock:
    return lock.PlaceLock(
        str(directory),
        name=".lock",
        holder={"pid": os.getpid()},
        describe=lambda holder: f"pid {holder.get('pid')}",
        refused=lambda holder: RuntimeError(f"held by {holder}"),
        moved=lambda where: RuntimeError(f"moved to {where}"),
        what="the test directory",
    )


def test_without_any_lock_call_the_place_lock_runs_unlocked_saying_so(without_lock_calls, tmp_path, caplog):
    """`lock_now` says ENOLCK, and the workdir lock does what it does on a file system without locks: a
    warning naming the directory, and the block runs. Before: fcntl imported at module level, so the
    lock was taken and no warning came."""
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as no_lock:
            lock.lock_now(fd)
    finally:
        os.close(fd)
    assert no_lock.value.errno == errno.ENOLCK
    with caplog.at_level(logging.WARNING):
        with _place_lock(tmp_path):
            pass
    said = [r.getMessage() for r in caplog.records if "this file system has no locks" in r.getMessage()]
    assert len(said) == 1 and str(tmp_path) in said[0], said


def test_on_windows_one_byte_far_beyond_the_record_is_locked(without_lock_calls, monkeypatch, tmp_path):
    """With msvcrt (a stand-in recording its calls): `msvcrt.locking(fd, LK_NBLCK, 1)` with the file at
    `WINDOWS_LOCK_OFFSET` (Windows' locks are mandatory: a locked byte of the record could not be read by
    the process that is refused), the file position left where it was; a refusal's EACCES comes through
    (PlaceLock's refusal)."""
    calls = []

    def locking(fd, mode, nbytes):
        calls.append((fd, mode, nbytes, os.lseek(fd, 0, os.SEEK_CUR)))
        if len(calls) == 2:
            raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setitem(sys.modules, "msvcrt", types.SimpleNamespace(LK_NBLCK=2, locking=locking))
    fd = os.open(tmp_path / "record", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b'{"pid": 1}\n')
        lock.lock_now(fd)
        with pytest.raises(OSError) as refused:
            lock.lock_now(fd)
        assert refused.value.errno == errno.EACCES
        assert calls == [(fd, 2, 1, lock.WINDOWS_LOCK_OFFSET)] * 2
        assert os.lseek(fd, 0, os.SEEK_CUR) == len(b'{"pid": 1}\n')
    finally:
        os.close(fd)


def test_without_o_nofollow_a_link_at_the_lock_path_is_still_refused(monkeypatch, tmp_path):
    """Windows has no O_NOFOLLOW: a link at the record's path is refused by the check before the open,
    and the file it points to is untouched. Before: AttributeError on os.O_NOFOLLOW."""
    monkeypatch.delattr(os, "O_NOFOLLOW")
    monkeypatch.setattr(lock, "NO_LINK_NO_WAIT_BYTES", os.O_NONBLOCK, raising=False)
    precious = tmp_path / "thesis.txt"
    precious.write_text("three years of work\n", encoding="utf-8")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / ".lock").symlink_to(precious)
    with pytest.raises(OSError, match=r"\.lock is a symbolic link \(to .*thesis\.txt\), not the lock file"):
        _place_lock(tmp_path / "w").acquire()
    assert precious.read_text(encoding="utf-8") == "three years of work\n"


@pytest.mark.parametrize("what", ["a lock file", "a directory"])
def test_the_download_lock_lets_one_holder_in_at_a_time(tmp_path, what):
    """Two holders (threads, each with its own lock: as two processes) take turns: the second enters
    only once the first has left. A directory is locked through DIRECTORY.lock beside it, so its own
    listing stays what the downloads put there (tests/test_lm1b.py lists it)."""
    path = tmp_path / ("downloads.lock" if what == "a lock file" else "downloads")
    if what == "a directory":
        path.mkdir()
    events, first_in, first_may_leave = [], threading.Event(), threading.Event()

    def first():
        with download.locked(str(path)):
            events.append("first in")
            first_in.set()
            first_may_leave.wait(60)
            events.append("first out")

    def second():
        first_in.wait(60)
        with download.locked(str(path)):
            events.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_in.wait(60)
    threads[1].join(0.5)  # the second waits (a slow machine can only make this pass, never fail)
    first_may_leave.set()
    for thread in threads:
        thread.join(60)
    assert events == ["first in", "first out", "second in"]
    if what == "a directory":
        assert os.listdir(path) == [] and os.path.exists(str(path) + ".lock")


def _resource(soft: int, hard: int) -> types.SimpleNamespace:
    """A stand-in for `resource` whose limits are (soft, hard) for every resource; records setrlimit."""
    stand_in = types.SimpleNamespace(RLIMIT_FSIZE=1, RLIMIT_NOFILE=7, RLIM_INFINITY=-1, set=[])
    stand_in.getrlimit = lambda which: (soft, hard)
    stand_in.setrlimit = lambda which, limits: stand_in.set.append((which, limits))
    return stand_in


def test_the_rlimit_checks_use_resource_where_it_exists_and_are_skipped_where_not(monkeypatch):
    """The file size limit (vectors_hdf5) and the open files limit (service) read `resource` when they
    run: a stand-in's limits are checked; without the module (Windows) there is nothing to check. Before:
    the module-level import meant the stand-in was never asked (no refusal; this test failed)."""
    monkeypatch.setitem(sys.modules, "resource", _resource(1000, 2000))
    with pytest.raises(OSError, match=r"out\.hdf5: the file needs up to 5,000 bytes, over .* 1,000 bytes") as big:
        vectors_hdf5._check_file_size_limit(5000, "out.hdf5")
    assert big.value.errno == errno.EFBIG
    with pytest.raises(ValueError, match="--max_connections=5000: .* over the 2000 files"):
        service._check_file_limit(5000)
    service.raise_file_limit(1000)
    assert sys.modules["resource"].set == [(7, (1000 + service.RESERVED_FILES, 2000))]
    monkeypatch.setitem(sys.modules, "resource", None)  # as on Windows
    vectors_hdf5._check_file_size_limit(5000, "out.hdf5")
    service._check_file_limit(5000)
    service.raise_file_limit(5000)


def test_without_fallocate_on_windows_nothing_is_reserved(monkeypatch, tmp_path):
    """Windows' `ctypes.CDLL(None)` is a TypeError (its CDLL looks for '/' in the name): the reservation
    is skipped as where fallocate is missing. Before: the TypeError escaped from every embed_file."""

    def windows_cdll(name, *args, **kwargs):
        return "/" in name  # what Windows' CDLL.__init__ does first with its name

    monkeypatch.setattr(vectors_hdf5.ctypes, "CDLL", windows_cdll)
    (tmp_path / "v.hdf5").write_bytes(b"")
    vectors_hdf5._reserve(str(tmp_path / "v.hdf5"), 1 << 20, "v.hdf5")
    assert os.path.getsize(tmp_path / "v.hdf5") == 0


class _Kernel32:
    """Stands in for Windows' kernel32: `processes` maps a pid to "running", "exited" or "denied"."""

    def __init__(self, processes):
        self.processes, self.closed, self.error = processes, [], 0

    def OpenProcess(self, access, inherit, pid):
        state = self.processes.get(pid)
        if state in (None, "denied"):
            self.error = 5 if state == "denied" else 87  # ERROR_ACCESS_DENIED, ERROR_INVALID_PARAMETER
            return 0
        return pid

    def WaitForSingleObject(self, handle, milliseconds):
        assert milliseconds == 0  # a probe, never a wait
        return 0x102 if self.processes[handle] == "running" else 0  # WAIT_TIMEOUT, WAIT_OBJECT_0

    def CloseHandle(self, handle):
        self.closed.append(handle)


def test_a_pid_is_probed_on_windows_without_os_kill(monkeypatch):
    """On Windows `os.kill(pid, 0)` sends CTRL_C_EVENT (0) to the pid's console group, and any other
    number terminates the process: the probe there asks kernel32 for a handle. Running, exited, another
    user's and no such process; each handle opened is closed. Failed before: `storage.atomic` had no
    Windows probe (and bucket_lock a second copy of the os.kill one)."""
    from elmo_jax.storage import atomic

    monkeypatch.setattr(os, "kill", lambda *a: pytest.fail("os.kill called"))
    kernel32 = _Kernel32({10: "running", 11: "exited", 12: "denied"})
    probe = lambda pid: atomic._windows_pid_running(pid, kernel32, lambda: kernel32.error)  # noqa: E731
    assert [probe(pid) for pid in (10, 11, 12, 13)] == [True, False, True, False]
    assert kernel32.closed == [10, 11]
