"""Writing a prepared corpus's ArrayRecord shards, in this process or in helper processes beside it.

    write_shard(path, text)      # text: records, each followed by b"\\n"; returns the record count
    with ShardProcesses(4) as pool:
        pool.submit(path, text, records)   # blocks while all 4 are busy; raises OSError if one failed
        ...                               # leaving the block waits for every shard and stops them

ArrayRecord writes one record per call and holds the interpreter lock while it does (most of preparing
a corpus once the text is read in bulk; measured: bench/RESULTS.md, "Design figures"), so with several
cores the shards are written by helper processes while this one reads on. A helper is this file run as
a script: it imports nothing but the standard library and `array_record` (not jax), starts at once, and
serves requests
on its stdin until that closes: each request is the shard's path and its text, length-prefixed; the
reply on its stdout is the number of records written. A helper that fails writes the reason to its
stderr and exits 1; one whose parent dies reads the end of its stdin and exits.
"""

from __future__ import annotations

import collections
import os
import struct
import subprocess
import sys
import tempfile

from array_record.python import array_record_module

# One record per chunk (random access reads one chunk per record) and no compression: writing runs
# several times faster than with the default (brotli) and reading needs no decompression, for a few
# bytes more per record (measured: bench/RESULTS.md, "Design figures").
WRITER_OPTIONS = "group_size:1,uncompressed"
_LENGTH = struct.Struct("<Q")


def write_shard(path: str, text: bytes) -> int:
    """Writes the records of `text` (each followed by b"\\n") to a new ArrayRecord file; returns their count."""
    records = text.split(b"\n")
    records.pop()  # the empty string after the last b"\n"
    writer = array_record_module.ArrayRecordWriter(path, WRITER_OPTIONS)
    try:
        collections.deque(map(writer.write, records), maxlen=0)  # one C call per record, no Python loop
    finally:
        writer.close()
    return len(records)


class ShardProcesses:
    """Up to `processes` helper processes writing shards; started at the first `submit`."""

    def __init__(self, processes: int):
        self.processes = processes
        self.idle: list[subprocess.Popen] = []
        self.busy: dict[subprocess.Popen, tuple[str, int]] = {}  # helper -> (path, records expected)
        self.errors: dict[subprocess.Popen, object] = {}  # every helper started -> the file of its stderr

    def submit(self, path: str, text: bytes, records: int) -> None:
        """Hands the shard to an idle helper, starting one or waiting for one to finish as needed."""
        if not self.idle and len(self.busy) < self.processes:
            errors = tempfile.TemporaryFile()  # a file, not a pipe: a chatty helper never blocks on it
            helper = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
            )
            self.errors[helper] = errors
            self.idle.append(helper)
        if not self.idle:
            self._wait_one()
        helper = self.idle.pop()
        name = path.encode("utf-8")
        try:
            helper.stdin.write(_LENGTH.pack(len(name)) + name + _LENGTH.pack(len(text)))
            helper.stdin.write(text)
            helper.stdin.flush()
        except OSError:
            self.busy[helper] = (path, records)
            self._wait_one(helper)  # raises with what the helper said
        self.busy[helper] = (path, records)

    def _wait_one(self, helper: subprocess.Popen | None = None) -> None:
        helper = helper or next(iter(self.busy))
        path, expected = self.busy.pop(helper)
        reply = helper.stdout.read(_LENGTH.size)
        if len(reply) < _LENGTH.size:
            helper.kill()
            helper.wait()
            self.errors[helper].seek(0)
            message = self.errors[helper].read().decode("utf-8", "replace").strip().splitlines()
            raise OSError(f"writing {path} failed: {message[-1] if message else 'the writer process died'}")
        written = _LENGTH.unpack(reply)[0]
        if written != expected:
            raise OSError(f"writing {path}: {written} records written, expected {expected}")
        self.idle.append(helper)

    def close(self) -> None:
        """Waits for every shard handed over (raising OSError if one failed) and stops the helpers."""
        try:
            while self.busy:
                self._wait_one()
        finally:
            self._stop(kill=bool(self.busy))

    def _stop(self, kill: bool) -> None:
        for helper, errors in self.errors.items():  # every helper started
            if kill:
                helper.kill()
            try:
                helper.stdin.close()  # a helper that is still serving reads the end and exits
            except OSError:
                pass  # it died with part of a request unread
            helper.wait()
            helper.stdout.close()
            errors.close()
        self.idle, self.busy, self.errors = [], {}, {}

    def __enter__(self) -> ShardProcesses:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:  # an error: stop without waiting for work that will be thrown away
            self._stop(kill=True)


def _read_exactly(stream, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def _serve(requests, replies) -> None:
    """Writes the shards requested on `requests` until it ends; replies with each one's record count."""
    while True:  # a read that comes up short: the parent closed the stream (or stopped mid-request)
        header = _read_exactly(requests, _LENGTH.size)
        if header is None:
            return
        path = _read_exactly(requests, _LENGTH.unpack(header)[0])
        header = _read_exactly(requests, _LENGTH.size)
        text = None if path is None or header is None else _read_exactly(requests, _LENGTH.unpack(header)[0])
        if text is None:
            return
        replies.write(_LENGTH.pack(write_shard(path.decode("utf-8"), text)))
        replies.flush()


if __name__ == "__main__":
    try:
        _serve(sys.stdin.buffer, sys.stdout.buffer)
    except Exception as e:  # noqa: BLE001 - the parent reads this line and raises it with the shard's name
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
