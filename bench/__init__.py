"""Benchmark scripts (each runnable as ``python bench/NAME.py``) and the harness they share
(``bench.quality_harness``); importable as a package so tests can check the harness on small inputs."""
