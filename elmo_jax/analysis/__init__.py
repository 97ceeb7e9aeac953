"""The paper's analyses of what a biLM's layers know, over the embedding library (`features`); an
application that imports no other application.

Its face, what the commands and the tests use:
- `probe_files.probe_files` (`python -m elmo_jax.probe`: nearest-neighbour and linear probes per layer),
  over `probing` and the probe files `probe_data` reads;
- `ablation_files.ablate_files` (`python -m elmo_jax.ablate`: one small task model with and without ELMo, the layer
  ablation and sample efficiency), over `ablation` and its task model `ablation_model`;
- `word_contexts` (`python -m elmo_jax.embed_text --neighbours`: a word's nearest contexts).
The modules are imported by name (this file imports nothing), so a command's `--help` costs no JAX.
"""
