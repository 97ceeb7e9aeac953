"""The paper's analyses of what a biLM's layers know: nearest-neighbour and linear probes
(`python -m elmo_jax.probe`), the layer ablation and sample efficiency (`python -m elmo_jax.ablate`),
and a word's nearest contexts (`embed_text --neighbours`). An application over the embedding library
(`features`); it imports no other application."""
