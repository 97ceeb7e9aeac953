"""The biLM as pure functions of arrays: architecture config, parameter pytree, character ids, the char
CNN, the LSTM stacks and their forward pass, FLOP counts. Imports nothing else of elmo_jax."""
