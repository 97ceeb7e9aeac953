"""The outage guard at storage's face (`storage/outage.py`), in process and without a service: every
operation of `storage` on a `gs://` place runs in `reaching(place)`, so while the service counts as
unreachable each one fails at once naming its place (a refusal says "N s ago", before any request); a
block that fails on a connection failure opens that window, an answer of the service does not; each try
of gcsfs's requests gets a deadline through fsspec's configuration.

The window is opened by a block that raises the error gcsfs raises when nothing answers, so no request is
made here; were an operation not guarded, it would reach for a closed loopback port (STORAGE_EMULATOR_HOST)
and fail after gcsfs's retries, saying "gave up" instead of "s ago". What the guard does for whole commands
against a stopped emulator is tests/test_gcs_outage.py.
"""

from __future__ import annotations

import errno
import socket

import pytest

for _module in ("fsspec", "gcsfs", "aiohttp"):
    pytest.importorskip(_module, reason=f"{_module} is not installed: pip install -e '.[gcs]'")

import aiohttp  # noqa: E402
import fsspec  # noqa: E402

from elmo_jax import storage  # noqa: E402
from elmo_jax.storage import outage  # noqa: E402

PLACE = "gs://outage-test-bucket/run"
UNREACHABLE = "Cloud Storage cannot be reached"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def nothing_answers(monkeypatch):
    """gcsfs pointed at a loopback port nothing listens on (anonymous, no listing cache); the outage
    forgotten before and after."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{_closed_port()}")
    for protocol in ("gs", "gcs"):
        monkeypatch.setitem(fsspec.config.conf, protocol, {"token": "anon", "use_listings_cache": False})
    outage.reset()
    yield
    outage.reset()


# The kinds of error that say nothing answered: aiohttp's (gcsfs), and the socket's (raised by the other
# clients, or found in the chain of an error that another library raised from one).
NOTHING_ANSWERED = {
    "ClientConnectionError": lambda: aiohttp.ClientConnectionError("Cannot connect to host 127.0.0.1:1"),
    "ConnectionRefusedError": lambda: ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
}


def _open_window(kind: str = "ClientConnectionError", place: str = f"{PLACE}/metrics.jsonl"):
    with pytest.raises(outage.StorageUnreachable) as raised:
        with storage.reaching(place):
            try:
                raise NOTHING_ANSWERED[kind]()
            except Exception as e:
                raise RuntimeError("a library's own error, raised from the client's") from e
    return raised.value


@pytest.mark.parametrize("kind", sorted(NOTHING_ANSWERED))
def test_a_connection_failure_in_a_block_names_its_place_and_opens_the_window(kind):
    assert not outage.unreachable()
    error = _open_window(kind)
    assert str(error).startswith(f"{PLACE}/metrics.jsonl: {UNREACHABLE} (gave up after ")
    assert f"; {kind}: " in str(error) and isinstance(error, OSError)
    assert outage.unreachable()


def test_an_answer_of_the_service_does_not_open_the_window():
    with pytest.raises(FileNotFoundError), storage.reaching(PLACE):
        raise FileNotFoundError(f"{PLACE}/missing")
    assert not outage.unreachable()


def _operations(tmp_path) -> dict:
    """{name: (the place its error must name, a call)}: every operation of `storage` on a URL."""
    local = tmp_path / "local.bin"
    local.write_bytes(b"x")
    file = f"{PLACE}/file.bin"
    return {
        "exists": (file, lambda: storage.exists(file)),
        "isdir": (PLACE, lambda: storage.isdir(PLACE)),
        "isfile": (file, lambda: storage.isfile(file)),
        "getsize": (file, lambda: storage.getsize(file)),
        "version": (PLACE, lambda: storage.version(file)),
        "listdir": (PLACE, lambda: storage.listdir(PLACE)),
        "listing": (PLACE, lambda: storage.listing(PLACE)),
        "glob": (f"{PLACE}/*.bin", lambda: storage.glob(f"{PLACE}/*.bin")),
        "open_file": (file, lambda: storage.open_file(file, "rb")),
        "read_bytes": (file, lambda: storage.read_bytes(file)),
        "rmtree": (PLACE, lambda: storage.rmtree(PLACE)),
        "remove": (file, lambda: storage.remove(file)),
        "rename": (file, lambda: storage.rename(file, f"{PLACE}/moved.bin")),
        "write_bytes": (file, lambda: storage.write_bytes(file, b"x")),
        "write_file": (file, lambda: storage.write_file(file, lambda f: f.write(b"x"))),
        "upload_file": (file, lambda: storage.upload_file(local, file)),
        "upload_tree": (f"{PLACE}/tree/local.bin", lambda: storage.upload_tree(tmp_path, f"{PLACE}/tree")),
        "publish_directory": (PLACE, lambda: storage.publish_directory(PLACE, lambda d: None, last="m.json")),
        "local_copy": (file, lambda: storage.local_copy(file).__enter__()),
        "download_tree": (PLACE, lambda: storage.download_tree(PLACE, tmp_path / "copy")),
        "mirror": (PLACE, lambda: storage.mirror(PLACE, "outage_test")),
        "creation_problem": ("gs://outage-test-bucket", lambda: storage.creation_problem(file)),
        "AppendLog": (f"{PLACE}/log.jsonl", lambda: storage.AppendLog(f"{PLACE}/log.jsonl")),
        "read_lines": (f"{PLACE}/log.jsonl", lambda: storage.read_lines(f"{PLACE}/log.jsonl")),
        "is_unfinished_publish": (PLACE, lambda: storage.is_unfinished_publish(PLACE, "m.json")),
    }


def test_every_operation_on_a_url_is_refused_at_once_in_the_window_naming_its_place(tmp_path):
    _open_window()
    for name, (place, call) in _operations(tmp_path).items():
        with pytest.raises(outage.StorageUnreachable) as raised:
            call()
        message = str(raised.value)
        assert message.startswith(f"{place}: {UNREACHABLE} ("), f"{name}: {message}"
        assert " s ago: ClientConnectionError: " in message, f"{name}: {message}"  # refused: no request made


def test_the_window_leaves_local_places_alone_and_lets_a_block_collect_earlier_work(tmp_path):
    _open_window()
    storage.write_bytes(tmp_path / "a.txt", b"local")
    assert storage.read_bytes(tmp_path / "a.txt") == b"local" and storage.exists(tmp_path / "a.txt")
    with storage.reaching(tmp_path):  # a local place: nothing to guard
        pass
    collected = []
    with storage.reaching(PLACE, refuse=False):  # waiting for a write started before the outage
        collected.append(True)
    assert collected == [True]


def test_an_open_file_is_read_through_the_guard(tmp_path):
    """A file opened before the outage: its reads are refused in the window, naming it."""

    class Remote:  # a file of gcsfs's that would answer, seen through the guard
        def readable(self):
            return True

        def writable(self):
            return False

        def seekable(self):
            return True

        def readinto(self, buffer):
            buffer[:3] = b"abc"
            return 3

        def close(self):
            pass

    from elmo_jax.storage import places

    raw = places._Reaching(Remote(), f"{PLACE}/open.bin")
    assert raw.readinto(bytearray(3)) == 3
    _open_window()
    with pytest.raises(outage.StorageUnreachable, match=rf"^{PLACE}/open.bin: {UNREACHABLE} \(\d+ s ago: "):
        raw.readinto(bytearray(3))


def test_each_try_of_gcsfs_gets_a_deadline_and_a_configured_one_is_kept(monkeypatch):
    _open_window()  # the first gs:// block installs it
    deadline = aiohttp.ClientTimeout(sock_connect=outage.CONNECT_S, sock_read=outage.READ_S)
    assert fsspec.filesystem("gs", token="anon", skip_instance_cache=True).requests_timeout == deadline

    monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon", "requests_timeout": 7.0})
    monkeypatch.setitem(fsspec.config.conf, "gcs", {})
    outage.install()
    assert fsspec.filesystem("gcs", skip_instance_cache=True).requests_timeout == 7.0
