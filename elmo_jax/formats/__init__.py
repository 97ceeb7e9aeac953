"""Files a biLM lives in: the published weight files (options JSON + HDF5), bilm-tf vocabularies, model
directories with their `jax.export` feature extractor, and atomic writes. Builds on `elmo_jax.model`."""
