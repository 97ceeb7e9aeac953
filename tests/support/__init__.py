"""Shared test support: tiny corpora and configs, comparisons of runs and files, and running the commands
as a person does. Test modules import from here (and from `tests.reference`), never from each other."""
