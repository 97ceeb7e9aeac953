"""The file pipeline (`python -m elmo_jax.embed_file`, `Embedder.embed_file`): a text file of sentences to
an HDF5 file of vectors, every input line checked before any compute, resumable after a stop or a kill,
over several processes. An application over the embedding library (`features`); it imports no other
application."""
