"""The performance targets the project holds, and the check bench/bench.py applies to its rows.

A target is a limit on one number of one bench row: at most (a ratio of times) or at least (a share of
copy bandwidth). A row at its limit meets it; one past it, or a number that was not measured (NaN), is
MISSED. The bench prints every target with a MISSED column and a summary line, and exits 1 when one is
missed (docs/performance.md, Targets). Decode ratios are under CUDA graph replay, against a `copy_` of the same
bytes timed in the same run; prefill shares are of the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECODE_COPY_RATIO = 1.15  # ours / copy_ of the same bytes under graph replay, partial RoPE both forms
FLOOR_MARGIN = 1.05  # the QNorm forward may be this far over the measured floor of its row
PREFILL_SHARE = {"partial_rope": 0.90, "qnorm_rope": 0.90}  # of copy bandwidth, every direction
QNORM_FORWARD_SHARE = 0.95  # the QNorm forward's prefill rows
# or this share of its row's bound (timing.rows_copy, a copy in its addressing, timed in the same run) where
# that is lower: a head-major row's copy reads below 0.95 of copy bandwidth (docs/records/*-tuning.md)
BOUND_SHARE = 0.98

# The QNorm forward's floor at decode per (B, H), over copy_ of the same bytes: a row must finish its sum of
# squares before its first store, which a copy need not; the target is FLOOR_MARGIN times it (docs/records/*-tuning.md)
QNORM_DECODE_FLOOR = {
    (1, 64): 1.18,
    (1, 128): 1.15,
    (8, 64): 1.18,
    (8, 128): 1.20,
    (64, 64): 1.08,
    (64, 128): 1.08,
    (256, 64): 1.05,
    (256, 128): 0.97,
}


@dataclass(frozen=True)
class Target:
    row: str  # the bench row, in words
    what: str  # the number and its limit, in words
    value: float
    limit: float
    at_most: bool  # True: value <= limit; False: value >= limit

    @property
    def missed(self) -> bool:
        met = self.value <= self.limit if self.at_most else self.value >= self.limit
        return not met  # NaN: not measured, missed


def qnorm_decode_limit(b: int, h: int) -> float:
    """ours / copy_ allowed for the QNorm forward at decode row (B, H)."""
    floor = QNORM_DECODE_FLOOR.get((b, h))
    return DECODE_COPY_RATIO if floor is None else max(DECODE_COPY_RATIO, FLOOR_MARGIN * floor)


def decode_targets(row: dict) -> list[Target]:
    """Targets of one decode row of the bench: kernel, B, H and the times (us) triton_us, compile_us
    (one call, no graph; its target only where torch.compile was timed), triton_graph_us, copy_graph_us,
    and for partial RoPE inplace_graph_us and inplace_copy_graph_us (the in-place call and a copy_ of its
    own bytes, B*H*R elements)."""
    kernel, b, h = row["kernel"], row["B"], row["H"]
    name = f"decode {kernel} B={b} H={h}"
    ratio = row["triton_graph_us"] / row["copy_graph_us"]
    limit = qnorm_decode_limit(b, h) if kernel == "qnorm_rope" else DECODE_COPY_RATIO
    form = "" if kernel == "qnorm_rope" else " out of place"
    out = [Target(name, f"ours{form} / copy_, graph replay <= {limit:.3g}", ratio, limit, True)]
    if "compile_us" in row:  # timed unless the run left torch.compile out (bench --impls)
        compiled = row["triton_us"] / row["compile_us"]
        out.append(Target(name, "ours / torch.compile per call (no graph) <= 1", compiled, 1.0, True))
    if kernel == "partial_rope":
        inplace = row["inplace_graph_us"] / row["inplace_copy_graph_us"]
        what = f"ours in place / copy_ of its bytes, graph replay <= {DECODE_COPY_RATIO:.3g}"
        out.append(Target(name, what, inplace, DECODE_COPY_RATIO, True))
    return out


def qnorm_prefill_limit(bound: float) -> float:
    """The share of copy bandwidth the QNorm forward's prefill row must reach, given its bound (the share a
    copy in its addressing reached in the same run; NaN: not measured): QNORM_FORWARD_SHARE, or BOUND_SHARE of
    the bound where that is lower."""
    return QNORM_FORWARD_SHARE if math.isnan(bound) else min(QNORM_FORWARD_SHARE, BOUND_SHARE * bound)


def prefill_targets(row: dict) -> list[Target]:
    """Targets of one prefill row of the bench: kernel, direction, B, H, S, layout, copy_fraction, and for
    forward rows rows_copy_fraction (the row's bound, bench.bench.rows_copy)."""
    kernel, direction = row["kernel"], row["direction"]
    name = f"prefill {kernel} {direction} {row['B']}x{row['H']}x{row['S']} {row['layout']}"
    if (kernel, direction) == ("qnorm_rope", "forward"):
        bound = row.get("rows_copy_fraction", math.nan)
        share = qnorm_prefill_limit(bound)
        what = f"share of copy bandwidth >= {QNORM_FORWARD_SHARE:.0%}"
        if share < QNORM_FORWARD_SHARE:
            what += f", or {BOUND_SHARE:.0%} of a copy in its addressing ({bound:.3f}): >= {share:.3f}"
    else:
        share = PREFILL_SHARE[kernel]
        what = f"share of copy bandwidth >= {share:.0%}"
    return [Target(name, what, row["copy_fraction"], share, False)]


def table(targets: list[Target]) -> list[str]:
    """Markdown lines: every target with its value and a MISSED column."""
    lines = ["| row | target | value | MISSED |", "|---|---|---|---|"]
    for t in targets:
        value = "not measured" if math.isnan(t.value) else f"{t.value:.3f}"
        lines.append(f"| {t.row} | {t.what} | {value} | {'MISSED' if t.missed else ''} |")
    return lines


def summary(targets: list[Target]) -> str:
    missed = [t for t in targets if t.missed]
    head = f"targets: {len(targets) - len(missed)} of {len(targets)} met, {len(missed)} MISSED"
    return head + "".join(f"\n  MISSED {t.row}: {t.what}, got {t.value:.3f}" for t in missed)
