"""Shared test helpers: tiny geometries, models, tokenizers and on-disk worlds, recipe overrides, rank launchers
and brute-force references. Test files import from here and never from each other, so each test file can be
read, run and changed on its own (``tests/test_test_layout.py`` checks it)."""
