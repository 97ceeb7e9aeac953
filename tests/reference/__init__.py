"""References the tests compare elmo_jax with, written from the equations (never from elmo_jax's outputs)."""
