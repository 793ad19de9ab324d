"""Command-line entry points, run from the repository root with the packages importable (installed, or
PYTHONPATH=src:reference as nox and tools/gpu_run.sh set it): `python -m tools.<name>`."""
