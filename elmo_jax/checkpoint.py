"""Training checkpoints with orbax: the train state, the data stream's position and the run's metadata.

One orbax step directory holds three items written together (orbax commits a step atomically: a
directory without its commit marker is never listed, so a crash mid-write leaves the previous
checkpoint as the newest):
  state  the `TrainState` pytree (parameters, Adagrad accumulators, step, RNG key, carried LSTM state);
  data   the batch stream's row positions (JSON), so the stream resumes bit for bit;
  meta   the resolved config and what the state was built for (JSON), to refuse incompatible resumes.
Saving is asynchronous: the arrays are copied off the device before `save` returns, then written in
the background; `close` waits for the last write.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpoints:
    """The checkpoints of one workdir (`WORKDIR/checkpoints/<step>`)."""

    def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                               create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, data_state: dict, meta: dict) -> None:
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        data=ocp.args.JsonSave(data_state),
                                                        meta=ocp.args.JsonSave(meta)))

    def restore_meta(self, step: int) -> dict:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
        """(state shaped like `abstract_state`, data stream state, meta) of a step.

        Leaves of `abstract_state` that carry a sharding (`sharding.with_shardings`) are restored into
        it, whatever mesh or process count wrote the checkpoint; the others onto this process's first
        device (the writer's sharding may name devices that do not exist here).
        """
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda a: ocp.utils.to_shape_dtype_struct(a) if getattr(a, "sharding", None) is not None
                              else jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), abstract_state)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
        return restored["state"], restored["data"], restored["meta"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
