"""The embedding library, text to ELMo vectors: `embed`, the token cache, many sentences at once
(`embed_sentences`: packing, length buckets, the batch runner on every local device), the output modes,
scalar mixes and task layers. Builds on `model` and `formats`; the applications (`files`, `serving`,
`analysis`) and the public face stand on it."""
