"""The peers' pinned releases, the one place their versions are written: the presets (dsrope_gate.presets)
import their code from exactly these releases and noxfile.py installs them. This module imports nothing, so
that the noxfile can load it by path without torch (pyproject's test extra repeats the transformers pin;
tests/test_pins.py holds the two equal)."""

PINS = {
    "transformers": "transformers==5.17.0",
    "transformers@5.23.0": "transformers==5.23.0",  # beside the pin: its own folder of the presets' cache
    "veomni": "veomni==0.1.12",
    "sglang": "sglang==0.5.23",
    "nemo-automodel": "nemo-automodel==0.7.0",
    "flash-attn": "flash-attn==2.8.3",
    "megatron-core": "megatron-core==0.19.2",
    "vllm": "vllm==0.33.0",
}


def version(name: str) -> str:
    """The pinned version of a peer: "0.5.23" for "sglang"."""
    return PINS[name].split("==")[1]


def release(name: str) -> str:
    """A pinned release as a folder name: "sglang-0.5.23"."""
    return f"{name}-{version(name)}"
