"""The file pipeline (`python -m elmo_jax.embed_file`, `Embedder.embed_file`): a text file of sentences to
an HDF5 file of vectors, every input line checked before any compute, resumable after a stop or a kill,
over several processes. An application over the embedding library (`features`); it imports no other
application.

Its face, what the command, `Embedder` and the tests use:
- `file_embedding.embed_model_file` (the command: the model a `ModelSource` names, checks first) and
  `file_embedding.embed_file` (loaded parameters);
- `file_options.Options` (the command's flags as one value) and its flag help texts;
- `sentence_input`'s choices for blank and long lines (the command's flags).
The rest (`file_output`, `file_staging`) is the pipeline's own. The modules are imported by name (this
file imports nothing), so the command's `--help` costs no JAX.
"""
