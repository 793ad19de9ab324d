"""The benchmarks: `python -m bench.bench` (nox -s bench) and `python -m bench.overhead`."""
