"""A tiny TFDS dataset the tests prepare themselves (TFDS's own `lm1b` downloads 1.7 GB)."""

from __future__ import annotations

import tensorflow_datasets as tfds


class Lm1bStandIn(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Writes a dataset where the stock `lm1b` builder looks for it (its download cannot run here)."""

    name = "lm1b"
    VERSION = tfds.core.Version("1.1.0")  # the stock builder's version
    # TFDS looks for a checksums file next to a builder's code, which for a builder defined outside a
    # package imports `importlib_resources`, not installed with TFDS 4.9.10; nothing is downloaded here.
    code_path = None
    LINES = {"train": ["a  train line", "another"], "test": ["  the test line ", "last"]}

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            supervised_keys=("text", "text"),
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split) for split in self.LINES}

    def _generate_examples(self, split):
        for index, line in enumerate(self.LINES[split]):
            yield f"line_{index}", {"text": line.strip()}  # as the stock builder stores them
