"""Assertions for other projects' test suites, as torch.testing's assert_close is used: the gate's judgement of
one implementation, raised as an AssertionError that says what failed and how to reproduce it.

    from dsrope_gate.testing import assert_conforms, assert_bitwise_equal

    assert_conforms(my_qnorm_rope, "qnorm_rope", semantics="two-boundaries")
    assert_bitwise_equal(trainer_rope, inference_rope, "partial_rope")

Both run the implementation through the conformance command's own door (dsrope_gate.conformance) on the
same default case set: the canonical DeepSeek-V4/V3 cases, the golden inputs, one probe per layout class and
the seeded hypothesis sweep, so an implementation gets one verdict from the command, these assertions, the
pytest marker and the parity matrix. The first assertion per op and case set computes the reference (most of
its time) and keeps it for the next; `examples=0, golden=False` is a smaller set for a quick check.
"""

from __future__ import annotations

import functools

from dsrope_gate.conformance import EXAMPLES
from dsrope_gate.ops import DEFAULT_CONTRACT, Op, op_named

DIRECTIONS = ("forward", "backward")


@functools.lru_cache(maxsize=8)
def _prepared_cases(op_name: str, device: str, dtypes: tuple, examples: int, golden: bool, seed: int, contract: str):
    """The case set, with the reference computed; kept for the next assertion on the same set (the reference
    is most of an assertion's time). Every call gets fresh copies of the inputs (dsrope_gate.conformance.calling),
    so nothing an implementation does reaches them."""
    from dsrope_gate.conformance import collect_cases

    op = op_named(op_name)
    cases, _ = collect_cases(op, examples, seed, None, golden=golden, dtypes=dtypes, device=device, contract=contract)
    return cases


def _device(device):
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def _forward_only(fn):
    """fn with its output detached: the backward is not judged (functools.wraps keeps fn's signature)."""

    @functools.wraps(fn)
    def forward(*args):
        out = fn(*args)
        return out.detach() if hasattr(out, "detach") else out

    return forward


def known_labels(op: Op) -> set[str]:
    """The semantics labels an assertion may ask for on `op`: every part of its emulations' labels."""
    return {part for emulations in op.emulations.values() for label in emulations for part in label.split("+")}


def _check_labels(op: Op, wanted: list[str]) -> None:
    unknown = [label for label in wanted if label not in known_labels(op)]
    if unknown:
        raise ValueError(f"semantics: unknown label(s) {unknown} for {op.name}; known: {sorted(known_labels(op))}")


def _judge(fn, op: Op, device, dtypes, backward, examples, golden, seed, in_place=False, isolate=False, accept=(),
           contract=DEFAULT_CONTRACT):  # fmt: skip
    from dsrope_gate.conformance import judge_target
    from dsrope_gate.conformance.isolation import TIMEOUT, Target

    if not callable(fn):
        raise TypeError(f"fn: expected the implementation to judge (a callable), got {fn!r}")
    cases = _prepared_cases(op.name, device, tuple(dtypes or ()), examples, golden, seed, contract)
    name = getattr(fn, "__qualname__", repr(fn))
    target = Target(name, fn=fn if backward else _forward_only(fn), in_place=in_place)
    result, outputs = judge_target(target, op, cases, device, isolate, TIMEOUT, lambda msg: None, accept=accept)
    return result, outputs, {p.case.name: p for p in cases}


def _first_violation_text(op: Op, direction: str, first: dict, prepared) -> list[str]:
    b, h, s, d = first["index"]
    dtype = prepared.inputs.x.dtype
    what = "grad" if direction == "backward" else "x"
    pair = f"{what} pair {first['input']}" if first["channel"] == "rotary" else f"{what} {first['input']}"
    table = f", cos/sin {first['cos_sin']}" if first["cos_sin"] else ""
    args = ", ".join(["x", "cos", "sin", str(prepared.case.rotary)] + ([repr(first["eps"])] if first["eps"] else []))
    call = f"fn({args})" if direction == "forward" else f"torch.autograd.grad(fn({args}), x, grad)[0]"
    grad_x = "x.requires_grad_(True); " if direction == "backward" else ""
    return [
        f"First element outside the model: case {first['case']!r} ({dtype}), index {first['index']}, "
        f"{first['channel']} channel:",
        f"  input: {pair}{table}; x's row rms {first['x_row_rms']:.6g}",
        f"  got {first['got']!r}, allowed [{first['bounds'][0]!r}, {first['bounds'][1]!r}], "
        f"reference {first['contract']!r} ({first['ulp']} ulp of {dtype} from the reference)",
        "Reproduce (paste into Python, with fn your implementation):",
        f"  import torch; {first['recipe']}",
        f"  {grad_x}print({call}[{b}, {h}, {s}, {d}])",
    ]


def _semantics_line(op: Op, record: dict, direction: str, contract: str = DEFAULT_CONTRACT) -> str:
    from dsrope_gate.conformance.judging import semantics_text

    labels = ", ".join(op.labels(contract)[direction].split("+"))
    return f"Semantics read off the bits: {semantics_text(record)} (the {contract} contract: {labels})."


def _direction_failure(op: Op, direction: str, record: dict, prepared: dict, result: dict) -> list[str]:
    from dsrope_gate.conformance import violations
    from dsrope_gate.conformance.judging import verdict_text
    from dsrope_gate.conformance.render import write_line

    verdict = verdict_text(record, result)
    share = record["outside_model"] / record["elements"] if record["elements"] else 0
    cases = [c for c in record["cases"] if c["outside_model"]]
    lines = [
        f"{op.name} {direction}: {verdict}: {record['outside_model']} of {record['elements']} elements "
        f"({100 * share:.4g}%) outside the error model, in {len(cases)} of {len(record['cases'])} cases judged; "
        f"{len(record['not_run'])} cases not run."
    ]
    first = record["first_violation"]
    if first:
        lines += _first_violation_text(op, direction, first, prepared[first["case"]])
    if cases:
        lines += violations.lines(record)
        shown = ", ".join(f"{c['case']} {c['outside_model']}/{c['elements']}" for c in cases[:6])
        lines.append(
            f"Outside the model per case: {shown}" + (f"; and {len(cases) - 6} more" if len(cases) > 6 else "")
        )
    lines += [write_line(w) for w in record["writes"][:3]]
    if record["not_run"]:
        shown = "; ".join(f"{n['case']}: {n['status']} ({n['error']})" for n in record["not_run"][:4])
        more = f"; and {len(record['not_run']) - 4} more" if len(record["not_run"]) > 4 else ""
        lines.append(f"Not run: {shown}{more}")
    lines.append(_semantics_line(op, record, direction, result["contract"]))
    return lines


def assert_conforms(
    fn,
    op: str | Op,
    *,
    device: str | None = None,
    semantics: str | list[str] | None = None,
    dtypes: list[str] | None = None,
    backward: bool = True,
    examples: int = EXAMPLES,
    golden: bool = True,
    seed: int = 0,
    in_place: bool = False,
    isolate: bool = False,
    accept: str | list[str] = (),
    contract: str = DEFAULT_CONTRACT,
) -> dict:
    """Raise AssertionError unless `fn`, an implementation of `op` ("qnorm_rope": fn(x, cos, sin, rotary, eps),
    or "partial_rope": fn(x, cos, sin, rotary)), conforms to the contract in every direction judged: every
    case ran, no element lies outside the reference's error model and no input was written into. The backward
    is judged through autograd when fn's output has a grad_fn and `backward` is true.

    Cases: the default case set, the conformance command's: the canonical DeepSeek-V4 and V3 cases of `dtypes`
    (default bf16, fp16, fp32), the golden inputs (`golden`), one probe per layout class and `examples` cases
    drawn by hypothesis from `seed`. `examples=0, golden=False` is a smaller, faster set.

    `semantics`: a label or labels (`python -m dsrope_gate.conformance --help` lists them; an unknown one is a
    ValueError) the bits must carry too: a forward label is read off the forward, a backward-only label
    ("no-boundary-2") off the backward. `in_place`: fn rotates x itself; what it writes into x is judged.
    `isolate`: judge fn in a child process of its own (a crash or a hang fails the assertion instead of the
    test run; fn must then be importable by name, a module-level function). `accept`: the name(s) of known
    diagnoses (dsrope_gate.diagnoses.KNOWN) accepted knowingly: where one explains every element outside the
    model of a direction, they do not fail it (any other element still does). `contract`: the contract judged
    (dsrope_reference.contracts: "two-boundaries", the training chain's, "fp32-through", "every-op-rounded",
    "bf16-tables"; docs/contract.md derives each). Returns the conformance command's result for fn (the JSON's
    record) when it passes."""
    __tracebackhide__ = True  # pytest shows the message, not the gate's frames
    op = op_named(op)
    device = _device(device)
    wanted = [semantics] if isinstance(semantics, str) else list(semantics or ())
    _check_labels(op, wanted)
    from dsrope_gate.diagnoses import check_accepted

    accepted = check_accepted([accept] if isinstance(accept, str) else list(accept))
    result, _, prepared = _judge(
        fn, op, device, dtypes, backward, examples, golden, seed, in_place, isolate, accepted, contract
    )
    name = result["impl"]
    failures = []
    for direction in DIRECTIONS:
        record = result[direction]
        if record is None or (direction == "backward" and not backward):
            continue
        if record["verdict"] != "conforms":
            failures += _direction_failure(op, direction, record, prepared, result)
    forward_labels = {part for label in op.emulations["forward"] for part in label.split("+")}
    for label in wanted:
        direction = "forward" if label in forward_labels else "backward"
        record = result[direction]
        read = record["semantics"] if record else []
        if label not in read:
            failures.append(
                f"Semantics: expected {label!r} in the {direction}; "
                + (_semantics_line(op, record, direction, contract) if record else "no backward (no grad_fn).")
            )
    if failures:
        raise AssertionError(f"{name} does not conform to {op.name} on {device}:\n" + "\n".join(failures))
    return result


def _first_difference(outputs_a: dict, outputs_b: dict, index: int):
    """(case, index, a's value, b's value, dtype) of the first element whose bits differ, or None."""
    from dsrope_reference.floats import ulp_distance

    for case, (a_out, b_out) in ((c, (outputs_a[c][index], outputs_b[c][index])) for c in outputs_a):
        if a_out is None or b_out is None or case not in outputs_b:
            continue
        a, b = a_out.detach().cpu(), b_out.detach().cpu()
        differ = (ulp_distance(a, b) != 0).nonzero()
        if len(differ):
            i = tuple(differ[0].tolist())
            return case, list(i), a[i].item(), b[i].item(), a.dtype
    return None


def assert_bitwise_equal(
    a,
    b,
    op: str | Op,
    *,
    device: str | None = None,
    dtypes: list[str] | None = None,
    backward: bool = True,
    examples: int = EXAMPLES,
    golden: bool = True,
    seed: int = 0,
    isolate: bool = False,
) -> None:
    """Raise AssertionError unless implementations `a` and `b` of `op` (a trainer's and an inference engine's)
    give the same bits on every case of assert_conforms's set, in both directions: every case run by both,
    every element 0 ulp apart (the project's one ulp distance: NaN meets NaN, -0 meets +0). The message gives, per
    direction, the share of elements equal, the largest distance in ulp and the first element that differs."""
    __tracebackhide__ = True
    from dsrope_gate.conformance.judging import against

    op = op_named(op)
    device = _device(device)
    runs = []
    for fn in (a, b):
        result, outputs, _ = _judge(fn, op, device, dtypes, backward, examples, golden, seed, isolate=isolate)
        runs.append((result["impl"], result, outputs))
    (name_a, result_a, outputs_a), (name_b, result_b, outputs_b) = runs
    compared = against(outputs_a, outputs_b)
    failures = []
    only = sorted(set(outputs_a) ^ set(outputs_b))
    if only or not outputs_a:
        failures.append(f"Cases run by one only: {', '.join(only) or 'none ran at all'}")
    for index, direction in enumerate(DIRECTIONS):
        d = compared.get(direction)
        if direction == "backward" and not backward:
            continue
        if d is None:
            if direction == "backward" and (result_a["backward"] is None) != (result_b["backward"] is None):
                failures.append("backward: one output carries a grad_fn, the other does not")
            continue
        if d["bitwise_equal"] < 1:
            case, i, va, vb, dtype = _first_difference(outputs_a, outputs_b, index)
            failures.append(
                f"{direction}: {100 * d['bitwise_equal']:.4f}% of elements bitwise equal, max {d['max_ulp']} ulp "
                f"apart; first differing element: case {case!r} ({dtype}), index {i}: {name_a} {va!r}, "
                f"{name_b} {vb!r}"
            )
    if failures:
        raise AssertionError(
            f"{name_a} and {name_b} ({op.name} on {device}) are not bitwise equal:\n" + "\n".join(failures)
        )
