"""The TPU form of code written with `lax.platform_dependent`, run on this CPU."""

from __future__ import annotations

from jax import lax


def force_tpu_form(monkeypatch) -> list[str]:
    """Makes every `lax.platform_dependent` take its `tpu` branch for the rest of the test; returns a list
    that gets one "tpu" per call, so that a test can show the forced form ran."""
    taken: list[str] = []

    def platform_dependent(*args, tpu, default):
        taken.append("tpu")
        return tpu(*args)

    monkeypatch.setattr(lax, "platform_dependent", platform_dependent)
    return taken
