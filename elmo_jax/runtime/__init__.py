"""What a long-running host process needs, whatever it runs (training, the file pipeline, downloads,
corpus preparation): stopping at a safe point on SIGINT/SIGTERM, the meetings of several processes, and
progress lines. At the bottom of the package beside `storage` and `model`: it imports nothing else of
elmo_jax."""
