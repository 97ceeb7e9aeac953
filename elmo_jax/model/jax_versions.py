"""JAX APIs that moved between the project's dependency floor (jax 0.6) and current releases, in one place."""

from __future__ import annotations

import jax


def shard_map_unchecked(body, **specs):
    """`jax.shard_map(body, check_vma=False, **specs)`; on jax < 0.7, where it is
    `jax.experimental.shard_map.shard_map` and the check is called `check_rep`, that one.

    The check is off: the callers' bodies communicate nothing or only what they say (a slice of a
    replicated value, independent rows), so the varying-manual-axes check has nothing to guard.
    """
    if hasattr(jax, "shard_map"):
        return jax.shard_map(body, check_vma=False, **specs)
    from jax.experimental.shard_map import shard_map  # jax 0.6

    return shard_map(body, check_rep=False, **specs)


def single_device_sharding(device: jax.Device) -> jax.sharding.Sharding:
    """The sharding that keeps a whole array on `device`: `jax.sharding.make_single_device_sharding`
    where jax has it (0.10.2 does; 0.12 deprecates the class it builds, `SingleDeviceSharding`, as a
    public name), the class itself where not (0.6.0)."""
    make = getattr(jax.sharding, "make_single_device_sharding", None)
    if make is not None:
        return make(device)
    return jax.sharding.SingleDeviceSharding(device)  # jax 0.6
