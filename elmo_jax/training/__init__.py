"""Training the biLM: language-model losses and the sampled softmax, the jitted train step sharded over
a device mesh, checkpoints, preemption, several hosts, metrics, and the loop that ties them together.
Builds on `model`, `formats` and `data`."""
