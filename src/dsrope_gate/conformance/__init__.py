"""Conformance: point the gate at any implementation of qnorm_rope or partial_rope and get a verdict,
element by element, and the semantics it computes, from evidence.

    python -m dsrope_gate.conformance --op qnorm_rope --impl mypkg.rope:qnorm_rope [--impl file.py:fn]
        [--preset NAME ...] [--device cpu|cuda] [--against TARGET] [--json PATH] [--out DIR]
    nox -s conformance -- <the same arguments>          (the command line: dsrope_gate.cli)

An implementation is a callable with the signature of the dsrope function it stands for (contract:
docs/contract.md): `qnorm_rope(x, cos, sin, rotary, eps)` or `partial_rope(x, cos, sin, rotary)`, x
[B, H, S, D] of any strides, cos/sin FP32 [B, S, R]. TARGET is `module.path:callable` (importable with
the current sys.path, PYTHONPATH included) or `path/to/file.py:callable`.

The default case set, every entry point's (the command, assert_conforms, the pytest marker, the parity
matrix): the canonical DeepSeek-V4 (D=512, R=64) and V3 (D=192, R=64: the rope slice trailing the 128 nope
channels) cases in bf16, fp16 and fp32; the golden inputs (dsrope_gate.golden.golden_root(), or a store
given); one probe per layout class; and EXAMPLES cases drawn by hypothesis from a seed. The reference's
models are computed once per case, here, whatever the number of implementations.

Each case runs twice, each time on fresh copies of every input in the case's layouts (gaps included): the
forward (nothing requires grad), then, when its output carries a grad_fn, the backward on an x that requires
grad with a fresh incoming gradient. Every input's storage is compared byte for byte before and after each
call: a write into any of them fails the verdict of the direction it happened in. An implementation declared
in place has what it writes into x judged as its output (`Target.in_place`).

Isolated (the command's default; `isolate=True` elsewhere), each implementation runs in a spawned child of
its own (isolation): its exit, signal, CUDA fault or a call past the time limit is its verdict, "crashed" or
"timed out", with the cases it finished kept and judged.

Verdict, per direction: conforms (every case run, every element inside the error model of the reference,
dsrope_reference, no write into an input), does not conform (an element outside the model that no accepted
diagnosis explains, a write, a wrong shape or dtype returned), partial (every element judged inside the
model, but some cases refused or raised), not run (nothing judged), crashed, timed out.

Semantics: for each known semantics an eager emulation (dsrope_gate.semantics) runs on the same inputs;
per case the share of elements whose bits equal each emulation's is reported, on the cases with normal
values (the canonical cases, the layout probes, the golden cases of random normal values). Edge values
(huge, tiny, subnormal, zero rows, the sweep's drawn kinds) judge the verdict only: there any reduction
order of a correct kernel moves the last bits of many elements. A label is listed when its
emulation agrees best (ties together) with at least 99.9% on every case whose bits carry the semantics:
every dtype for partial_rope; bf16 and fp16 for qnorm_rope, whose fp32 cases judge the verdict only (the
rounding boundaries are no-ops there, and a kernel's own rstd, its reduction order and an approximate
rsqrt, moves last bits of every element of a row).

The package, one job a module: `calling` (one implementation on one case: fresh inputs, writes), `isolation`
(a child process per implementation), `judging` (the reference's verdict, the semantics, bit comparisons),
`violations` (where the elements outside the model are, and the diagnosis that explains them), `render`
(markdown, and the short summary the command prints, the verdict table last). What is judged for each op,
and how an implementation of it is called, is its record in dsrope_gate.ops.

--device cpu runs Triton code in the interpreter with dsrope's round-to-nearest-even fp32 -> bf16
conversion (what a GPU does) and eager code as it is; --device cuda compiles.
"""

from __future__ import annotations

from pathlib import Path

from dsrope_gate.conformance.isolation import TIMEOUT, Target
from dsrope_gate.ops import DEFAULT_CONTRACT, DIRECTIONS, Op, op_named

EXAMPLES = 24  # hypothesis-drawn cases in the default case set (every entry point's: docs/judging.md)


def collect_cases(op: Op, examples: int = EXAMPLES, seed: int = 0, golden_root: Path | None = None, progress=None,
                  golden: bool = True, dtypes=None, device="cpu", contract: str = DEFAULT_CONTRACT):  # fmt: skip
    """(the prepared cases, a note on the golden inputs): the default case set of every entry point, the same
    for the command, assert_conforms, the pytest marker and the parity matrix: the canonical DeepSeek-V4/V3
    cases (of `dtypes`, default all three), the golden inputs (`golden`), one probe per layout class and
    `examples` cases drawn by hypothesis from `seed`. Inputs on `device` (the CPU where children judge: they
    copy them onto theirs), each with its reference models under `contract`, computed once."""
    from dsrope_gate import case_sets
    from dsrope_gate.conformance.judging import prepare

    if examples < 0:
        raise ValueError(f"examples: expected a number of drawn cases >= 0, got {examples}")
    op.labels(contract)  # a ValueError naming the contracts for an unknown one
    progress = progress or (lambda msg: None)
    own = op.own_judge()
    if own:  # an op with cases of its own (rope_tables: dsrope_gate.tables.CASES)
        return own.collect_cases(op, progress, device)
    progress("building cases; computing the reference")
    wanted = set(dtypes or ("bfloat16", "float16", "float32"))
    made = [prepare(op, c, c.build(device), contract=contract) for c in case_sets.canonical() if c.dtype in wanted]
    gold, note = golden_cases(op, device, golden_root, contract) if golden else ([], "golden inputs: not asked for")
    drawn = case_sets.probes() + case_sets.sweep(op, examples, seed)
    made += gold + [prepare(op, c, c.build(device), contract=contract) for c in drawn]
    progress(f"{len(made)} cases")
    return made, note


def golden_cases(op: Op, device, root: Path | None, contract: str = DEFAULT_CONTRACT):
    """The golden store's cases for `op`: their stored inputs in their recorded layouts, their stored models (the
    default contract's; another contract's are computed from the stored inputs)."""
    from dsrope_reference.rope import Model

    from dsrope_gate import golden as store
    from dsrope_gate.conformance.judging import prepare

    root = store.golden_root() if root is None else root
    if not (root / "manifest.json").is_file():
        return [], f"golden inputs: no store at {root} (pass --golden DIR)"
    manifest = store.verify_all(root)
    out = []
    for record in manifest["cases"]:
        if op.name not in record["kernels"]:
            continue
        _, tensors = store.load_case(root, manifest, record["name"])
        case, inputs = store.laid_out_inputs(record, tensors, device)
        if contract != DEFAULT_CONTRACT:
            out.append(prepare(op, case, inputs, contract=contract))
            continue
        models = {}
        for direction, stage in DIRECTIONS.items():
            m = store.decode_stage(f"{op.name}.{stage}", tensors)
            models[direction] = Model(m["ref"], m["lo"], m["hi"])
        out.append(prepare(op, case, inputs, models))
    return out, f"golden inputs: {len(out)} cases from {root}"


def in_process_caller(target: Target, op: Op, device: str):
    """A caller that runs the target's calls in this process (debugging; assert_conforms's default)."""
    from dsrope_gate.conformance.calling import call

    fn = target.load(op.name, device)
    own = op.own_judge()
    if own:
        return lambda case, inputs: own.call(op, fn, case, inputs, target.in_place, device)
    return lambda case, inputs: call(op, fn, case, inputs, target.in_place, device)


def judge_target(target: Target, op: Op, cases, device, isolate: bool, timeout: float, progress, each_case=None,
                 accept=()):  # fmt: skip
    """(result, outputs) of one target on the prepared cases: in a child process of its own when `isolate`.
    A target that cannot be loaded raises isolation.LoadError (a usage error). `accept`: diagnoses accepted."""
    from dsrope_gate.conformance.isolation import Child, LoadError
    from dsrope_gate.conformance.judging import run_impl

    own = op.own_judge()
    run_impl = own.run_impl if own else run_impl
    if not isolate:
        if device == "cpu":
            # every Triton kernel judged here (any project's) stores bf16 rounded to nearest even, as a GPU
            # does; Triton's interpreter alone truncates
            from dsrope.interpreter import install_interpreter_rounding

            install_interpreter_rounding()
        try:
            caller = in_process_caller(target, op, device)
        except Exception as e:
            from dsrope_gate.conformance.calling import error_line

            raise LoadError(error_line(e)) from e
        result, outputs = run_impl(target.name, caller, op, cases, device, progress, each_case, accept)
        return result | {"device_name": device_name(device)}, outputs
    child = Child(target, op.name, device, timeout)
    try:
        result, outputs = run_impl(target.name, child.call, op, cases, device, progress, each_case, accept)
    finally:
        child.stop()
    return result | {"device_name": child.device_name}, outputs


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"


def as_target(impl) -> Target:
    """A Target from a Target or a (name, callable) pair."""
    if isinstance(impl, Target):
        return impl
    name, fn = impl
    return Target(name, fn=fn)


def run_meta(results, cases, examples, seed, note, isolate, contract=DEFAULT_CONTRACT) -> dict:
    """What a report says of the run: date, device, versions, the case set, whether it was isolated."""
    import datetime

    import torch
    import triton

    return {
        "date": datetime.date.today().isoformat(),
        "device": next((r["device_name"] for r in results), "none judged"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cases": len(cases),
        "sweep": examples,
        "seed": seed,
        "golden": note,
        "isolated": isolate,
        "contract": contract,
    }


def judge_all(op, impls, device="cpu", examples=EXAMPLES, seed=0, golden_root=None, progress=print, each_case=None,
              isolate=False, timeout=TIMEOUT, dtypes=None, accept=(), contract=DEFAULT_CONTRACT):  # fmt: skip
    """Judge each implementation (a Target, or a (name, callable) pair) on `op` (an Op or its name), every one
    on the same cases (the default set). Returns (results as in the JSON, each implementation's outputs per
    case in the same order, the prepared cases, meta). `isolate`: each implementation in a spawned child of its
    own with `timeout` seconds per call (the reference stays here). `progress` gets a line per stage and per
    implementation, `each_case` (when given) one per case. `dtypes`: only the canonical cases of these.
    `accept`: the names of diagnoses accepted knowingly (dsrope_gate.diagnoses). `contract`: the contract judged
    (dsrope_reference.contracts: two-boundaries, fp32-through, every-op-rounded, bf16-tables)."""
    op = op_named(op)
    # judged in children, the inputs stay on the CPU here: this process never touches CUDA
    cases, note = collect_cases(
        op, examples, seed, golden_root, progress, dtypes=dtypes, device="cpu" if isolate else device,
        contract=contract,
    )  # fmt: skip
    results, outputs = [], []
    for impl in impls:
        result, out = judge_target(as_target(impl), op, cases, device, isolate, timeout, progress, each_case, accept)
        results.append(result)
        outputs.append(out)
    drawn = 0 if op.own_judge_module else examples  # an op with cases of its own draws none
    judged = cases[0].contract if cases else contract  # an op with a contract of its own names it (rope_tables)
    return results, outputs, cases, run_meta(results, cases, drawn, seed, note, isolate, judged)


def run(op, impls, device="cpu", examples=EXAMPLES, seed=0, golden_root=None, against_impl=None, progress=print,
        each_case=None, isolate=False, timeout=TIMEOUT, contract=DEFAULT_CONTRACT):  # fmt: skip
    """Judge each implementation on `op` (an Op or its name); with against_impl (a Target or (name, callable))
    compare each with it element by element. Returns (results as in the JSON, meta)."""
    from dsrope_gate.conformance.judging import against

    everyone = list(impls) + ([against_impl] if against_impl is not None else [])
    results, outputs, _, meta = judge_all(
        op, everyone, device, examples, seed, golden_root, progress, each_case, isolate, timeout, contract=contract
    )
    if against_impl is not None:
        for result, out in zip(results[:-1], outputs[:-1], strict=True):
            result["against"] = {"impl": as_target(against_impl).name} | against(out, outputs[-1])
    return results, meta
