"""Maintenance scripts of the repository, each runnable as ``python -m tools.NAME``: they read the package's code
to write files that must follow it (the generated reference pages), so they live beside the package, not in it,
and a wheel does not carry them."""
