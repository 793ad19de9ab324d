"""dsrope_dev.bench_compare on made-up bench runs: every target of either run side by side with its value,
after - before and each run's status, a target one run lacks marked `not run`, empty CSV fields left out (a
decode row without torch.compile gets no compile target), and the summary line's counts."""

from __future__ import annotations

import csv

from dsrope_dev.bench_compare import compare, main, read_targets

PREFILL = ["kernel", "direction", "B", "H", "S", "layout", "triton_ms", "copy_fraction", "rows_copy_fraction"]
DECODE = ["kernel", "B", "H", "S", "triton_us", "compile_us", "triton_graph_us", "copy_graph_us"]
DECODE += ["inplace_graph_us", "inplace_copy_graph_us"]


def write_run(folder, prefill, decode):
    folder.mkdir()
    for name, fields, rows in (("bench.csv", PREFILL, prefill), ("decode.csv", DECODE, decode)):
        with open(folder / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, restval="")
            writer.writeheader()
            writer.writerows(rows)
    return folder


def prefill_row(kernel, direction, share, bound=""):
    row = dict(kernel=kernel, direction=direction, B=1, H=64, S=4096, layout="token_major", triton_ms=0.1)
    return row | dict(copy_fraction=share, rows_copy_fraction=bound)


def decode_row(kernel, ours, copy, inplace="", compile_us=""):
    row = dict(kernel=kernel, B=1, H=64, S=1, triton_us=5.0, compile_us=compile_us)
    row |= dict(triton_graph_us=ours, copy_graph_us=copy)
    return row | (dict(inplace_graph_us=inplace, inplace_copy_graph_us=copy) if inplace else {})


def runs(tmp_path):
    before = write_run(
        tmp_path / "before",
        [prefill_row("qnorm_rope", "forward", 0.955, 0.97), prefill_row("partial_rope", "backward", 0.93)],
        [decode_row("partial_rope", 2.2, 2.0, inplace=2.4)],
    )
    after = write_run(
        tmp_path / "after",
        [prefill_row("qnorm_rope", "forward", 0.945, 0.97), prefill_row("partial_rope", "backward", 0.94)],
        [decode_row("partial_rope", 2.0, 2.0, inplace=2.2), decode_row("qnorm_rope", 2.4, 2.0, compile_us=10.0)],
    )
    return before, after


def line_of(lines, row, what):
    found = [line for line in lines if line.startswith(f"| {row} | {what}")]
    assert len(found) == 1, (row, what, lines)
    return [cell.strip() for cell in found[0].strip("|").split("|")]


def test_targets_side_by_side(tmp_path):
    before, after = runs(tmp_path)
    lines = compare(read_targets(before), read_targets(after))

    qnorm = line_of(lines, "prefill qnorm_rope forward 1x64x4096 token_major", "share of copy bandwidth >= 95%")
    assert qnorm[2:] == ["0.955", "0.945", "-0.010", "met", "MISSED"]
    partial = line_of(lines, "prefill partial_rope backward 1x64x4096 token_major", "share of copy bandwidth >= 90%")
    assert partial[2:] == ["0.930", "0.940", "+0.010", "met", "met"]
    out_of_place = line_of(lines, "decode partial_rope B=1 H=64", "ours out of place / copy_")
    assert out_of_place[2:] == ["1.100", "1.000", "-0.100", "met", "met"]
    inplace = line_of(lines, "decode partial_rope B=1 H=64", "ours in place / copy_")
    assert inplace[2:] == ["1.200", "1.100", "-0.100", "MISSED", "met"]
    # a row only the second run has; its compile target only where compile_us was written
    qnorm_decode = line_of(lines, "decode qnorm_rope B=1 H=64", "ours / copy_, graph replay <= 1.24")
    assert qnorm_decode[2:] == ["not run", "1.200", "", "", "met"]
    assert line_of(lines, "decode qnorm_rope B=1 H=64", "ours / torch.compile")[2:] == [
        "not run",
        "0.500",
        "",
        "",
        "met",
    ]
    assert not [line for line in lines if "partial_rope" in line and "torch.compile" in line]
    assert lines[-1] == "before: 3 of 4 met, 1 MISSED; after: 5 of 6 met, 1 MISSED"


def test_a_missing_run_is_an_error(tmp_path, capsys):
    before, _ = runs(tmp_path)
    assert main([str(tmp_path / "nothing"), str(tmp_path / "nothing either")]) == 2
    assert main([str(before), str(before)]) == 0
    assert "before: 3 of 4 met, 1 MISSED; after: 3 of 4 met, 1 MISSED" in capsys.readouterr().out
