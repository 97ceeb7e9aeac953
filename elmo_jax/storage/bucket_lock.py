"""A lock on a directory in Cloud Storage, where there is no `flock` (`lock.PlaceLock` uses it for URLs).

The lock is an object, e.g. `gs://BUCKET/WORKDIR/.elmo_jax.lock`, holding who took it (pid, host, start time,
command) and when it last said it was alive (`heartbeat`, seconds since the epoch). Every write of it is
conditional on the object's generation, which Cloud Storage checks atomically on the server:

- taking the lock creates the object with `if_generation_match=0` (only if absent), so of two runs
  starting at once exactly one succeeds;
- the holder rewrites it every `HEARTBEAT_S` seconds, conditional on the generation it last wrote;
- a lock left behind by a killed run is taken over (a conditional rewrite of the generation that was read,
  so of two runs taking over at once one wins) when its holder was a process on this host that no longer
  runs, or when its heartbeat is older than `STALE_S` (its host stopped: a preempted VM);
- a clean exit deletes it (conditional on the generation written last).

A kernel lock is released the moment its holder dies; this one only when a run on the same host starts,
or `STALE_S` after the last heartbeat. A run refused meanwhile is told when the lock will count as
abandoned.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable

from absl import logging

from elmo_jax.storage import outage
from elmo_jax.storage.atomic import pid_running

HEARTBEAT_S = 30.0
STALE_S = 180.0  # six missed heartbeats: its host is gone (a preempted pod is re-created within minutes)
RELEASE_S = 30.0  # retries of the delete on exit (google-cloud-storage's default: 120 s)


class BucketLock:
    """An exclusive lock held as a Cloud Storage object (`acquire`, `release`).

    Args:
      url: gs://BUCKET/NAME of the lock object.
      me: what the object says about the holder (pid, host, started, command).
      describe: holder record -> the words naming it in messages.
      refused: (the holder's description) -> the exception raised when another process holds the lock.
      what: how messages name the locked directory ("the workdir").
    """

    def __init__(
        self, url: str, me: dict, *, describe: Callable[[dict], str], refused: Callable[[str], Exception], what: str
    ):
        bucket, _, name = url.split("://", 1)[1].partition("/")
        self.url, self._me, self._describe, self._refused, self._what = url, dict(me), describe, refused, what
        self._bucket, self._name = bucket, name
        self._generation: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _blob(self):
        from google.cloud import storage

        return storage.Client().bucket(self._bucket).blob(self._name)

    def _write(self, blob, generation: int) -> None:
        """Writes this holder's record if the object's generation is `generation` (0: absent)."""
        record = {**self._me, "heartbeat": time.time()}
        blob.upload_from_string(
            json.dumps(record) + "\n", content_type="application/json", if_generation_match=generation
        )
        self._generation = blob.generation

    def acquire(self) -> None:
        """Takes the lock, or raises `error` (another run holds it) or OSError (the bucket cannot be
        reached or written: no such bucket, no permission, no credentials)."""
        from google.api_core import exceptions
        from google.auth import exceptions as auth_exceptions

        try:
            blob = self._blob()
            try:
                self._write(blob, 0)
            except exceptions.PreconditionFailed:
                self._take_over_or_refuse(blob)
        except (exceptions.GoogleAPICallError, auth_exceptions.GoogleAuthError) as e:
            message = " ".join(str(e).split())[:300]
            raise OSError(
                f"cannot lock {self._what} {os.path.dirname(self.url)} ({type(e).__name__}: {message}); the bucket "
                "must exist and these credentials need roles/storage.objectUser on it (docs/CLOUD_STORAGE.md)"
            ) from None
        self._thread = threading.Thread(target=self._beat, name="elmo_jax-workdir-lock", daemon=True)
        self._thread.start()

    def _take_over_or_refuse(self, blob) -> None:
        from google.api_core import exceptions

        try:
            blob.reload()
            generation = blob.generation
            previous = json.loads(blob.download_as_bytes(if_generation_match=generation))
        except exceptions.NotFound:  # released between our two requests: try once more from the start
            previous, generation = {}, 0
        except (exceptions.PreconditionFailed, ValueError):
            previous, generation = {"unreadable": True}, blob.generation
        if previous and not self._abandoned(previous):
            since = time.time() - float(previous.get("heartbeat", 0))
            raise self._refused(
                f"{self._describe(previous)}; alive {since:.0f} s ago. A holder that stopped without releasing "
                f"it (its host went away) counts as gone {STALE_S:.0f} s after it was last alive"
            )
        try:
            self._write(blob, generation)
        except exceptions.PreconditionFailed:
            raise self._refused("another holder took it just now") from None
        if previous:
            logging.warning(
                "taking over %s: its run (%s) ended without releasing it (killed?)", self.url, self._describe(previous)
            )

    def _abandoned(self, previous: dict) -> bool:
        if previous.get("unreadable"):
            return True
        if previous.get("host") == socket.gethostname() and isinstance(previous.get("pid"), int):
            return not pid_running(previous["pid"])
        return time.time() - float(previous.get("heartbeat", 0)) > STALE_S

    def _beat(self) -> None:
        from google.api_core import exceptions

        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._write(self._blob(), self._generation)
            except exceptions.PreconditionFailed:
                logging.error("%s was taken over by another run: this workdir now has two writers", self.url)
                return
            except Exception as e:  # a network error: the next beat tries again
                logging.warning("could not renew %s (%s)", self.url, e)

    def release(self) -> None:
        """Deletes the lock object. When Cloud Storage cannot be reached (`outage`: a request of this
        process gave up on it) it is left, with a warning: the next run on this host takes it over at once
        (its holder no longer runs), one elsewhere after `STALE_S`; google-cloud-storage would otherwise
        retry the delete for 120 s, and a heartbeat in flight for as long."""
        from google.api_core import exceptions
        from google.cloud.storage.retry import DEFAULT_RETRY

        self._stop.set()
        if outage.unreachable():
            logging.warning("left %s behind: Cloud Storage cannot be reached (a re-run takes it over)", self.url)
            return
        if self._thread is not None:
            self._thread.join()
        try:
            self._blob().delete(if_generation_match=self._generation, retry=DEFAULT_RETRY.with_timeout(RELEASE_S))
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            pass
        except Exception as e:  # a network error: the lock is taken over as after a kill
            logging.warning("could not delete %s (%s): a re-run takes it over", self.url, e)
