"""Benchmark scripts, each runnable as ``python bench/NAME.py``; importable as a package so tests can check the
benchmarks' own pieces (``bench.modeled_speedup``) on small inputs."""
