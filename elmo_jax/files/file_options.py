"""How to embed a file (`Options`, whose fields are embed_file's flags) and the checks of those choices
that need no model. Light to import (no JAX): the command's flags name these choices before `--help`
or parsing, and `file_embedding` checks them before anything is loaded.
"""

from __future__ import annotations

import dataclasses

TOKEN_CACHE_MODES = ("auto", "off")
# The options that decide the vectors: a spool made with other values is not continued. --batch_tokens,
# --devices and --bucketing only decide how the work is batched (the vectors agree to float32 rounding).
IDENTITY_OPTIONS = (
    "layers",
    "mix_scalars",
    "gamma",
    "float16",
    "compute_dtype",
    "blank_lines",
    "max_sentence_tokens",
    "long_sentences",
    "sentence_index",
)


@dataclasses.dataclass(frozen=True)
class Options:
    """How to embed a file; the fields mirror the command-line flags."""

    layers: str = "all"
    mix_scalars: tuple[float, ...] | None = None
    gamma: float = 1.0
    batch_tokens: int = 4096
    float16: bool = False
    compute_dtype: str = "float32"
    blank_lines: str = "empty"
    max_sentence_tokens: int = 1024
    long_sentences: str = "error"
    bucketing: bool = True
    sentence_index: bool = True
    progress: bool = False
    overwrite: bool = False  # replace an existing output, if it is an elmo-command HDF5 file
    devices: tuple[int, ...] | None = None  # indices into jax.local_devices(); None: all
    token_cache: str = "auto"  # "auto": cache the vocabulary's words (when there is one); "off"
    resume: bool = True  # continue a killed run's work on the same input and arguments

    def check(self) -> None:
        """Raises ValueError (naming the flag) for a --token_cache or --batch_tokens that cannot be used
        (the layers and the mix are checked against the model, `output_modes.output_mode`; the input
        policies as the input is read, `sentence_input.scan`)."""
        if self.token_cache not in TOKEN_CACHE_MODES:
            raise ValueError(f"--token_cache must be one of {TOKEN_CACHE_MODES}, found {self.token_cache!r}")
        if self.batch_tokens < 1:
            raise ValueError(f"--batch_tokens must be positive, found {self.batch_tokens}")
