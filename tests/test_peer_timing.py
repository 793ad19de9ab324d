"""The forward+backward table of `bench --backward` (dsrope_dev.peer_timing; the bench itself needs CUDA and
tests never import it): which cells are not timed and why, and the markdown with its legend."""

from __future__ import annotations

import pytest

from dsrope_dev import peer_timing
from dsrope_gate import presets
from dsrope_gate.inputs import ON_GPU
from dsrope_gate.ops import PARTIAL_ROPE

# the largest shape of the bench: 4 x 128 x 16384 x 512, past 2**31 elements
LARGEST = 4 * 128 * 16384 * 512


def impl(backward="autograd", offsets_32bit=False):
    return presets.Implementation("x:y", PARTIAL_ROPE, lambda *a: None, backward=backward, offsets_32bit=offsets_32bit)


def test_a_row_is_not_run_for_want_of_a_backward_or_past_2_31_with_32_bit_offsets():
    assert peer_timing.not_run(impl(backward=None), 10) == "no backward"
    assert peer_timing.not_run(impl(backward=None, offsets_32bit=True), LARGEST) == "no backward"
    assert peer_timing.not_run(impl(offsets_32bit=True), 2**31 + 1) == "not run (> 2**31)"
    assert peer_timing.not_run(impl(offsets_32bit=True), 2**31) is None
    assert peer_timing.not_run(impl(), LARGEST) is None


# the GPU host has no network: megatron-core's module would be fetched (pip download retries) where not carried
@pytest.mark.skipif(ON_GPU, reason="noxfile.py's `tests` installs the peers on CPU")
def test_the_presets_declarations_decide_their_cells():
    """sglang is forward only; megatron-core's kernel offsets are 32-bit, nemo-automodel's 64-bit (its kernel
    takes the program id as int64): the bench's largest shape runs the one and not the other."""
    loaded = {i.name: i for i in presets.load(["sglang", "nemo-automodel", "megatron-core"], "cpu", None, print)}
    sglang = loaded.get("sglang:apply_rotary_emb_triton")
    if sglang is not None:
        assert peer_timing.not_run(sglang, 10) == "no backward"
    nemo = loaded.get("nemo-automodel:apply_complex_rope")
    if nemo is not None:
        assert peer_timing.not_run(nemo, LARGEST) is None
    megatron = loaded.get("megatron-core:fused_apply_mla_rope_for_q")
    if megatron is not None:
        assert peer_timing.not_run(megatron, 10) is None
        assert peer_timing.not_run(megatron, LARGEST) == "not run (> 2**31)"
    if not loaded:
        pytest.skip("none of sglang, nemo-automodel, megatron-core loads here")


def test_the_table_shows_times_markers_and_the_legend_of_the_markers_it_shows():
    rows = [
        peer_timing.row("partial_rope", 1, 64, 4096, "ours", ms=0.12345),
        peer_timing.row("partial_rope", 1, 64, 4096, "peer", marker="no backward"),
        peer_timing.row("partial_rope", 4, 128, 16384, "ours", ms=2.0),
        peer_timing.row("partial_rope", 4, 128, 16384, "peer", marker="failed", error="OutOfMemoryError:\n 80 GiB"),
        peer_timing.row("qnorm_rope", 1, 64, 4096, "ours", ms=0.5),
    ]
    text = peer_timing.markdown(rows, "today, a GPU")
    rope, qnorm = text.split("qnorm_rope, forward+backward")
    assert "| B | H | S | ours | peer |" in rope
    assert "| 1 | 64 | 4096 | 0.123 | no backward |" in rope
    assert "| 4 | 128 | 16384 | 2.000 | failed |" in rope
    assert f"- no backward: {peer_timing.LEGEND['no backward']}" in rope
    assert f"- failed: {peer_timing.LEGEND['failed']}" in rope
    assert "  - peer at 4 x 128 x 16384: OutOfMemoryError: 80 GiB" in rope  # the error on one line
    assert "not run (> 2**31)" not in text  # a marker no cell shows has no legend line
    assert "| B | H | S | ours |" in qnorm and "| 1 | 64 | 4096 | 0.500 |" in qnorm and "- " not in qnorm
    assert text.startswith("Measured today, a GPU.")


def test_a_row_has_a_time_or_a_known_marker():
    with pytest.raises(ValueError, match="row: give ms or marker"):
        peer_timing.row("partial_rope", 1, 1, 1, "x", ms=1.0, marker="failed")
    with pytest.raises(ValueError, match="row: give ms or marker"):
        peer_timing.row("partial_rope", 1, 1, 1, "x")
    with pytest.raises(ValueError, match="is none of"):
        peer_timing.row("partial_rope", 1, 1, 1, "x", marker="slow")
