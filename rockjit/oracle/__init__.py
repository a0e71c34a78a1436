"""Test oracles: what a correct NPU result must satisfy (tolerance.py: error bounds).

Nothing in the compiler imports this package (tests/test_import_graph checks it): an oracle
the compiler depended on could bend to agree with it."""
