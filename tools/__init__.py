"""Project scripts, run from the repository root (`python -m tools.golden`, `python tools/<name>.py`)."""
