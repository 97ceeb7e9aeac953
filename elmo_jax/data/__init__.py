"""What training reads: plain-text corpora, TFDS datasets, the embedded default corpus, vocabulary
building and bilm-tf's deterministic, resumable batch stream. Builds on `model` and `formats`."""
