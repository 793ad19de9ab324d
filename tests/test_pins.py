"""The peers' pins have one home (dsrope_gate.pins): pyproject's test extra names the same transformers
release, and noxfile.py writes no peer's version of its own."""

from __future__ import annotations

import re
from pathlib import Path

from dsrope_gate.pins import PINS, release, version

ROOT = Path(__file__).resolve().parents[1]


def test_the_test_extra_pins_the_transformers_of_pins():
    pinned = re.findall(r'"(transformers==[^"]*)"', (ROOT / "pyproject.toml").read_text())
    assert pinned == [PINS["transformers"]]


def test_the_noxfile_writes_no_peer_version():
    text = (ROOT / "noxfile.py").read_text()
    written = [name for name in PINS if re.search(rf"[\"']{re.escape(name)}==", text)]
    assert written == [], f"noxfile.py pins {written} itself: use PINS (src/dsrope_gate/pins.py)"


def test_version_and_release_read_the_pin():
    assert PINS["sglang"] == f"sglang=={version('sglang')}" and release("sglang") == f"sglang-{version('sglang')}"
