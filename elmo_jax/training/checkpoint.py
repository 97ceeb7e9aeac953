"""Training checkpoints with orbax: the train state, the data stream's position and the run's metadata.

One orbax step directory holds three items written together:
  state  the `TrainState` pytree (parameters, Adagrad accumulators, step, RNG key, carried LSTM state);
  data   the batch stream's row positions (JSON), so the stream resumes bit for bit;
  meta   the resolved config and what the state was built for (JSON), to refuse incompatible resumes.
Saving is asynchronous: the arrays are copied off the device before `save` returns, then written in
the background; `wait` and `close` wait for the last write.

What can go wrong on disk, and what happens:
- A process killed mid-write leaves `<step>.orbax-checkpoint-tmp`: orbax writes there and renames it
  to `<step>` only when complete, so it is never listed or restored; the training manager removes it
  on start and says so. In Cloud Storage, which has no rename, orbax writes `<step>` in place and
  uploads `<step>/commit_success.txt` last; a step without it is incomplete, never listed, and removed
  the same way.
- A write that fails (disk full, quota) raises `CheckpointWriteError` naming the step and the newest
  complete checkpoint, which is untouched. A checkpoint directory that cannot be written to (read-only,
  immutable) raises it from `save` itself, before anything runs in the background, and what orbax's
  threads print about the failed write afterwards is dropped (`orbax_noise`).
- Old checkpoints beyond `keep` are first renamed into `checkpoints/.deleting/` and then removed, so a
  process killed while deleting one never leaves a half-deleted step under a step's name (in Cloud
  Storage orbax deletes them in place: a half-deleted step may lose its commit_success.txt last, and is
  then an incomplete step, removed on the next start).
- A complete checkpoint damaged later (a truncated or deleted file) fails to restore: `restore_newest`
  says which one and why, and falls back to the previous one that restores, moving the bad one aside
  to `<step>.corrupt` (never deleted) when asked; with no good one it refuses, naming them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from elmo_jax import storage
from elmo_jax.model.jax_versions import single_device_sharding
from elmo_jax.runtime import processes
from elmo_jax.training import orbax_noise

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's name for a step directory being written
COMMIT_FILE = "commit_success.txt"  # in Cloud Storage, the object orbax writes last into a complete step
DELETING = ".deleting"  # old steps are renamed in here before they are removed (not a step name)
CORRUPT_SUFFIX = ".corrupt"  # a step moved aside; no underscore: orbax would read "x_5" as step 5


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the message names it and the newest complete one."""


class CheckpointCorruptError(ValueError):
    """No checkpoint of a workdir can be restored; the message names each one and why."""


# TensorStore ends an error with payloads, ` [key='value']` (quotes in the value escaped): the cause's OS
# error code, and on some paths (opening a driver) the whole array spec, a kilobyte of JSON that would bury
# the cause ("... File too large [tensorstore_spec='{...}'] [os_error_code='27']").
_TENSORSTORE_PAYLOAD = re.compile(r" \[(\w+)='(?:[^'\\]|\\.)*'\]")


def _brief(error: BaseException) -> str:
    """The first line of an error (orbax and TensorStore append pages of spec), without TensorStore's spec
    payloads, at most ~300 characters: its start and its end, where TensorStore puts the cause ("File too
    large [os_error_code='27']")."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = _TENSORSTORE_PAYLOAD.sub(lambda m: m.group(0) if m.group(1) == "os_error_code" else "", text)
    if len(text) > 300:
        text = f"{text[:140]} ... {text[-160:]}"
    return f"{type(error).__name__}: {text}"


def _unreachable(error: BaseException | None) -> bool:
    """Whether `error` (or one it was raised from) says the storage could not be reached at all
    (`storage.StorageUnreachable`, a ConnectionError): no checkpoint is damaged, none can be read."""
    while error is not None:
        if isinstance(error, ConnectionError):
            return True
        error = error.__cause__ or error.__context__
    return False


def _on_disk(state: Any) -> Any:
    """The tree a state is written as: a dataclass's fields as a dict, leaving out those that hold None,
    so that a field added later with None for "absent" (`TrainState.average` of a run that keeps no weight
    average) leaves the format of every checkpoint written before it unchanged, and those still restore."""
    if dataclasses.is_dataclass(state):
        return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if getattr(state, f.name) is not None}
    return state


def _from_disk(restored: Any, abstract_state: Any) -> Any:
    """The state `_on_disk` wrote, rebuilt as `abstract_state`'s type (its None fields stay None)."""
    if dataclasses.is_dataclass(abstract_state):
        return dataclasses.replace(abstract_state, **restored)
    return restored


class Checkpoints:
    """The checkpoints of one workdir (`WORKDIR/checkpoints/<step>`).

    Args:
      keep: newest complete checkpoints kept.
      async_save: write in the background (training); False for readers and one-off saves.
      writer: the training run's manager, which removes incomplete writes of killed runs on start
        (a reader must not: a run may be writing in the same workdir).
    """

    def __init__(self, workdir: str, keep: int = 3, async_save: bool = True, writer: bool = False):
        self.directory = storage.join(storage.absolute(workdir), "checkpoints")
        self._writer = writer
        if writer and jax.process_index() == 0:
            for tmp in self._incomplete():
                logging.warning(
                    "removing %s: an incomplete checkpoint write (the run writing it was killed "
                    "or its write failed); it was never restorable",
                    tmp,
                )
                storage.rmtree(tmp)
            self._empty_deleting()
        if writer:
            processes.barrier("elmo_jax.training.checkpoint: incomplete writes removed")
        self._async = async_save
        orbax_noise.install()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=async_save,
            create=True,
            todelete_subdir=DELETING,
            # The step directory is created in `save` itself (a failure raises there), not in the
            # background: orbax would start the item writers first, each a non-daemon thread waiting up to
            # 300 s (its fixed coordination timeout) for a "directory created" signal that a failed
            # creation never sends, and the process could not exit until they gave up.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
        )
        # orbax reaches a gs:// directory through its own clients: `storage.reaching` puts the outage guard
        # (fail at once, naming the place, once the service is known to be unreachable) around each call.
        with storage.reaching(self.directory):
            self.manager = ocp.CheckpointManager(self.directory, options=options)
        self._writing: int | None = None  # the step of a save not yet known to be complete

    def _incomplete(self, step: int | None = None) -> list[str]:
        """The step directories being written or left incomplete (of `step`, or of any step)."""
        if not storage.isdir(self.directory):
            return []
        names = storage.listdir(self.directory)
        prefix = "" if step is None else f"{step}{TMP_SUFFIX}"
        found = [n for n in names if n.startswith(prefix) and TMP_SUFFIX in n]
        # In a bucket orbax writes a step in place, file by file, COMMIT_FILE last (locally it renames).
        steps = [n for n in names if n.isdigit() and (step is None or n == str(step))]
        found += [n for n in steps if storage.is_unfinished_publish(storage.join(self.directory, n), COMMIT_FILE)]
        return [storage.join(self.directory, n) for n in sorted(found)]

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, data_state: dict, meta: dict) -> None:
        """Starts writing checkpoint `step` (first waiting for the previous write, which may fail).

        Raises CheckpointWriteError when this or the previous write fails.
        """
        self.wait()
        self._writing = step
        try:
            with storage.reaching(storage.join(self.directory, str(step))):
                self.manager.save(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardSave(_on_disk(state)),
                        data=ocp.args.JsonSave(data_state),
                        meta=ocp.args.JsonSave(meta),
                    ),
                )
        except Exception as e:
            self._failed(e)
        if not self._async:  # a synchronous save is complete here
            self._writing = None

    def wait(self) -> None:
        """Waits for the last write (and the removal of older steps it made). Raises CheckpointWriteError
        when it failed."""
        try:
            with storage.reaching(self.directory, refuse=False):  # a write already started is waited for
                self.manager.wait_until_finished()
        except Exception as e:
            self._failed(e)
        self._writing = None
        if self._writer and jax.process_index() == 0:
            self._empty_deleting()

    def _empty_deleting(self) -> None:
        """Removes the old steps orbax renamed into `DELETING` (a step there is no longer a checkpoint).
        With the storage out of reach they wait for the next call (the save that follows says so)."""
        deleting = storage.join(self.directory, DELETING)
        with contextlib.suppress(storage.StorageUnreachable):
            for name in sorted(storage.listdir(deleting)) if storage.isdir(deleting) else []:
                storage.rmtree(storage.join(deleting, name))

    def _failed(self, error: Exception):
        step, self._writing = self._writing, None
        try:
            if _unreachable(error):
                raise error
            self.manager.reload()
            latest = self.manager.latest_step()
        except Exception:  # the disk may be in no state to list it; the message says so
            latest = None
        # The partial write is no checkpoint: free its space now. Orbax threads may still be finishing
        # and leave some of it behind; the next training run removes what is left.
        unreachable = _unreachable(error)
        if jax.process_index() == 0 and not unreachable:
            for tmp in self._incomplete(step):
                storage.rmtree(tmp)
        if unreachable:  # nothing could be listed: the checkpoints already there are as they were
            kept = "the complete checkpoints written before it are kept"
            fix = "Re-run the same command once the storage can be reached again to resume from the newest"
        else:
            kept = (
                f"the newest complete checkpoint, {storage.join(self.directory, str(latest))}, is intact"
                if latest is not None
                else "there is no earlier complete checkpoint"
            )
            fix = "Free space (or fix the file system) and re-run the same command to resume from it"
        raise CheckpointWriteError(
            f"could not write checkpoint {storage.join(self.directory, str(step))} ({_brief(error)}); {kept}. {fix}"
        ) from error

    def restore_meta(self, step: int) -> dict:
        with storage.reaching(storage.join(self.directory, str(step))):
            return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
        """(state shaped like `abstract_state`, data stream state, meta) of a step.

        Leaves of `abstract_state` that carry a sharding (`sharding.with_shardings`) are restored into
        it, whatever mesh or process count wrote the checkpoint; the others onto this process's first
        device (the writer's sharding may name devices that do not exist here).
        """
        device = single_device_sharding(jax.local_devices()[0])
        target = jax.tree.map(
            lambda a: (
                ocp.utils.to_shape_dtype_struct(a)
                if getattr(a, "sharding", None) is not None
                else jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device)
            ),
            abstract_state,
        )
        with storage.reaching(storage.join(self.directory, str(step))):
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(_on_disk(target)),
                    data=ocp.args.JsonRestore(),
                    meta=ocp.args.JsonRestore(),
                ),
            )
        return _from_disk(restored["state"], abstract_state), restored["data"], restored["meta"]

    def restore_newest(
        self,
        target: Callable[[dict], Any],
        check_meta: Callable[[dict], None] = lambda m: None,
        move_aside: bool = False,
    ) -> tuple[int, Any, dict, dict] | None:
        """(step, state, data stream state, meta) of the newest checkpoint that restores; None if there
        is no checkpoint at all.

        Args:
          target: meta -> the abstract state to restore into (see `restore`).
          check_meta: raises (ValueError) when a checkpoint is of another run; that is no corruption
            and ends the search.
          move_aside: rename each newer checkpoint that failed to `<step>.corrupt` once an older one
            restored (so the run saves those steps again); readers leave them where they are.

        Raises CheckpointCorruptError when checkpoints exist but none restores.
        """
        bad: list[tuple[int, str]] = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            restored, error = self._try_restore(step, target, check_meta)
            if _unreachable(error):  # no damage found: nothing is moved aside or reported as corrupt
                raise OSError(f"cannot read checkpoint {storage.join(self.directory, str(step))}: {error}") from error
            # Every process must take the same branch (they all read the same files, but say so).
            if processes.agree_max(int(error is not None)):
                bad.append((step, _brief(error) if error else "failed on another process"))
                logging.error(
                    "checkpoint %s cannot be restored (%s)", storage.join(self.directory, str(step)), bad[-1][1]
                )
                continue
            if bad:
                self._report_fallback(bad, step, move_aside)
            return (step, *restored)
        if bad:
            listed = "; ".join(f"{storage.join(self.directory, str(s))}: {why}" for s, why in bad)
            raise CheckpointCorruptError(
                f"no checkpoint in {self.directory} can be restored ({listed}). They are "
                "left as they are; move the directory aside to start from scratch"
            )
        return None

    def _try_restore(
        self, step: int, target: Callable[[dict], Any], check_meta: Callable[[dict], None]
    ) -> tuple[tuple[Any, dict, dict] | None, Exception | None]:
        """(`restore`'s (state, data, meta), None) of checkpoint `step`, or (None, the failure) when its
        meta or its arrays cannot be read; `check_meta`'s error (another run's checkpoint) is raised."""
        try:
            meta = self.restore_meta(step)
        except Exception as e:
            return None, e
        check_meta(meta)
        try:
            return self.restore(step, target(meta)), None
        except Exception as e:
            return None, e

    def _report_fallback(self, bad: list[tuple[int, str]], step: int, move_aside: bool) -> None:
        names = ", ".join(storage.join(self.directory, str(s)) for s, _ in bad)
        if move_aside:
            if jax.process_index() == 0:
                for s, _ in bad:
                    path = storage.join(self.directory, str(s))
                    aside = path + CORRUPT_SUFFIX
                    n = 1
                    while storage.exists(aside):
                        n, aside = n + 1, f"{path}{CORRUPT_SUFFIX}{n + 1}"
                    storage.rename(path, aside)
                    logging.warning("moved the unrestorable checkpoint %s aside to %s (not deleted)", path, aside)
            processes.barrier("elmo_jax.training.checkpoint: corrupt checkpoints moved aside")
            self.manager.reload()
        logging.warning(
            "USING THE OLDER CHECKPOINT %s: the newer %s cannot be restored (see above); the steps "
            "after %d are done again",
            storage.join(self.directory, str(step)),
            names,
            step,
        )

    def close(self) -> None:
        """Waits for the last write (raising CheckpointWriteError when it failed), then closes."""
        try:
            self.wait()
        finally:
            self.manager.close()
