"""The test environment itself: conftest must have forced 8 CPU devices and strict rank promotion."""

import jax


def test_eight_devices():
    """Sharding code needs several devices; conftest forces 8 host devices so it runs everywhere."""
    assert len(jax.devices()) == 8


def test_rank_promotion_raises():
    """Implicit rank promotion is an error in tests, so library code must broadcast explicitly."""
    assert jax.config.jax_numpy_rank_promotion == "raise"
