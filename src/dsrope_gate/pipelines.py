"""Pipelines: from positions to q, the path a trainer and an inference engine each run, compared bit by bit.

A pipeline is one preset's table builder (dsrope_gate.table_builders) and its q path (dsrope_gate.presets: its
qnorm_rope implementation; where it has none, the contract's norm, F.rms_norm in x's dtype, then its
partial_rope), both of one preset name, `NAME` or `NAME@VERSION` (PIPELINES says which of its entries). On each
case (PipelineCase: a DeepSeek-V4 table case of dsrope_gate.tables, plain rope for its main layers and YaRN for
its compress ones, with an x of the DeepSeek-V4 q shape [B, H, S, 512], rotary 64, in bf16 or fp32), each
pipeline, in a spawned child of its own (dsrope_gate.conformance.isolation), returns:

- its tables built from the case's positions (the pairs' entries of cos and sin, [2, B, S, R/2]), by the builder
  its model calls for activations of x's dtype: on bf16 cases a "(bf16 activations)" builder where the project
  builds its tables in the activations' dtype;
- its q path's output on its own tables (end to end);
- its q path's output on the reference tables, the contract's correctly rounded FP32 tables
  (dsrope_reference.rope_tables), so that two q paths are compared on the same tables.

The matrix (`pairs`) gives for each pair, case kind and dtype: the share of bitwise-equal table entries; on the
reference tables, the share of equal elements in the unrotated channels (the norm alone writes them) and in the
rotary ones; end to end, each on its own tables; and where their bits part first (`where_they_part`): `tables`,
`norm`, `rotation` or `nowhere`. The semantics of each q path are read off its output on the reference tables
with the qnorm_rope emulations (dsrope_gate.semantics) on the bf16 cases (in fp32 the norm's roundings are
no-ops): a pair whose unrotated channels agree but whose norm labels differ (two-boundaries against
fp32-through: whether the normalized row is rounded before the rotation shows in the rotary channels alone)
parts at the norm.

    python -m dsrope_gate.conformance --pipeline transformers@5.23.0 --pipeline vllm [--device cuda] [--out DIR]
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass
from typing import NamedTuple

import torch
from dsrope_reference.rope_tables import CPU_ULPS

from dsrope_gate import semantics, tables
from dsrope_gate.conformance.calling import REFUSALS, Call, Watch, error_line, same_layout_copy
from dsrope_gate.conformance.isolation import TIMEOUT, Child, ChildDied, LoadError, Target
from dsrope_gate.conformance.judging import bits_compare
from dsrope_gate.inputs import values
from dsrope_gate.ops import PIPELINE, QNORM_ROPE


@dataclass(frozen=True)
class Pipeline:
    """What a preset runs from positions to q: `q`, its implementation's name within the preset (after `NAME:`);
    `tables`, its table builders' names within the preset, the first that takes a case (one for plain tables, one
    for YaRN where the project splits them); `bf16_tables`, those its model calls with bf16 activations (none:
    `tables` on every case); `norm_first`: q is a partial_rope, the contract's norm runs before it."""

    q: str
    tables: tuple[str, ...]
    bf16_tables: tuple[str, ...] = ()
    norm_first: bool = False


PIPELINES = {
    "dsrope": Pipeline("qnorm_rope_triton", ("freqs_cis_from_position_ids",)),
    "transformers": Pipeline(
        "DeepseekV4UnweightedRMSNorm+apply_rotary_pos_emb",
        ("DeepseekV4RotaryEmbedding",),
        ("DeepseekV4RotaryEmbedding(bf16 activations)",),
    ),
    "vllm": Pipeline("xpu_qnorm_rope_kv_fp8_insert", ("DeepseekV4ScalingRotaryEmbedding.cos_sin_cache",)),
    "sglang": Pipeline("fused_norm_rope_inplace_triton", ("precompute_freqs_cis",)),
    "nemo-automodel": Pipeline(
        "deepseek_v4.q_norm+_apply_partial_rope",
        ("deepseek_v4.DeepseekV4RotaryEmbedding",),
        ("deepseek_v4.DeepseekV4RotaryEmbedding(bf16 activations)",),
    ),
    # its q path in this preset is its rope alone; its plain and YaRN tables are two modules
    "megatron-core": Pipeline(
        "fused_apply_mla_rope_for_q",
        ("RotaryEmbedding", "YarnRotaryEmbedding"),
        ("RotaryEmbedding", "YarnRotaryEmbedding(bf16 activations)"),
        norm_first=True,
    ),
    "veomni": Pipeline("apply_rotary_pos_emb_triton", ("DeepseekV4RotaryEmbedding",), norm_first=True),
}

HEADS, HEAD_DIM, ROTARY, EPS = 4, 512, 64, 1e-6  # DeepSeek-V4's q head (D 512, R 64), its norm's eps; 4 heads
DTYPES = ("bfloat16", "float32")  # a bf16 model's activations, and FP32 (where every table builder is FP32)
PARTS = ("tables", "norm", "rotation", "nowhere")


@dataclass(frozen=True)
class PipelineCase:
    """One call of every pipeline: a table case of DeepSeek-V4 (its positions and rope config) and x of dtype
    `dtype`, [B, HEADS, S, 512] token-major, normal values from the table case's seed. Its repr rebuilds it."""

    table: tables.TableCase
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.table.name}-{self.dtype}"

    @property
    def kind(self) -> str:
        return tables.kind(self.table)

    rotary = property(lambda self: ROTARY)
    theta = property(lambda self: self.table.theta)
    rope_scaling = property(lambda self: self.table.rope_scaling)
    eps = property(lambda self: EPS)

    def x(self) -> torch.Tensor:
        t = self.table
        shape = (t.batch, t.seq, HEADS, HEAD_DIM)
        return values(shape, getattr(torch, self.dtype), t.positions.seed).transpose(1, 2)


CASES = [
    PipelineCase(case, dtype)
    for case in tables.CASES
    if tables.kind(case) in ("v4-main", "v4-compress")
    for dtype in DTYPES
]


class PipelineInputs(NamedTuple):
    """A case's inputs: positions int64 [B, S], x [B, H, S, D], the reference tables FP32 [B, S, R] (the pairs'
    entries first, the rest NaN: a q path must not read them)."""

    positions: torch.Tensor
    x: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


def reference_tables(case: tables.TableCase):
    """The contract's correctly rounded FP32 tables of a case (its model's reference values), [B, S, R]."""
    out = []
    for model in tables.reference_model(case, 1.0, CPU_ULPS):
        half = model.ref.float()
        out.append(torch.cat((half, torch.full_like(half, float("nan"))), -1))
    return out


def inputs(case: PipelineCase) -> PipelineInputs:
    return PipelineInputs(case.table.position_ids(), case.x(), *reference_tables(case.table))


# --- in the child: one pipeline loaded, called per case -------------------------------------------------------


class Runner:
    """A pipeline loaded in this process, callable with PIPELINE's signature: (cos, sin) of its tables, the
    builder that made them, its q path's output on them and on the reference tables."""

    def __init__(self, pipeline: Pipeline, builders: dict, q):
        self.pipeline, self.builders, self.q_fn = pipeline, builders, q

    def tables(self, positions, dtype, rotary, theta, rope_scaling):
        names = (self.pipeline.bf16_tables if dtype == torch.bfloat16 else ()) or self.pipeline.tables
        said = []
        for name in names:
            try:
                return name, self.builders[name](positions, rotary, theta, rope_scaling)
            except NotImplementedError as e:
                said.append(f"{name}: {error_line(e)}")
        raise NotImplementedError("no table builder of the pipeline takes the case: " + "; ".join(said))

    def q(self, x, cos, sin, rotary, eps):
        if self.pipeline.norm_first:
            return self.q_fn(semantics.normalized(x, eps, "two-boundaries").to(x.dtype), cos, sin, rotary)
        return self.q_fn(x, cos, sin, rotary, eps)

    def __call__(self, positions, x, reference_cos, reference_sin, rotary, theta, rope_scaling, eps) -> dict:
        builder, own = self.tables(positions, x.dtype, rotary, theta, rope_scaling)
        return {
            "builder": builder,
            "tables": own,
            "q": self.q(same_layout_copy(x), *own, rotary, eps),
            "q_reference": self.q(same_layout_copy(x), reference_cos, reference_sin, rotary, eps),
        }


def load_preset(preset: str, name: str, device: str) -> Runner:
    """The pipeline of preset `preset` (NAME or NAME@VERSION), its builders and q path loaded here."""
    from dsrope_gate import presets, table_builders

    pipeline = PIPELINES[preset.partition("@")[0]]
    said = []
    builders = {b.name.partition(":")[2]: b for b in table_builders.load([preset], said.append)}
    impls = {i.name.partition(":")[2]: i for i in presets.load([preset], device, None, said.append)}
    missing = [n for n in (*pipeline.tables, *pipeline.bf16_tables) if n not in builders]
    missing += [] if pipeline.q in impls else [pipeline.q]
    if missing:
        raise LookupError("; ".join(said) or f"pipeline {name}: {preset} has no {missing}")
    return Runner(pipeline, builders, impls[pipeline.q].fn)


def call(op, fn, case, inputs, in_place=False, device=None, started=None) -> Call:
    """The pipeline on fresh copies of the case's inputs (on `device`), writes into them watched: a Call whose
    extras hold, on the CPU, the builder used, its tables' pairs' entries [2, B, S, R/2] and both q outputs."""
    if started:
        started("forward")
    copies = PipelineInputs(*(same_layout_copy(t, device) for t in inputs))
    watch = Watch(copies._asdict(), "forward")
    try:
        with torch.no_grad():
            out = op.call(fn, case, copies.x, copies)
    except REFUSALS as e:
        return Call("refused", error=error_line(e))
    except Exception as e:  # a pipeline's crash is a finding, never the command's
        return Call("raised", error=error_line(e))
    writes = watch.writes()
    problem = tables.malformed(case.table, out["tables"])
    x = copies.x
    for stage in ("q", "q_reference"):
        q = out[stage]
        if not problem and (not isinstance(q, torch.Tensor) or q.shape != x.shape or q.dtype != x.dtype):
            problem = f"{stage}: expected {x.dtype} {list(x.shape)}, got {getattr(q, 'dtype', type(q).__name__)}"
    if problem:
        return Call("wrong output", error=problem, writes=writes)
    half = case.rotary // 2
    pairs = torch.stack([t[..., :half] for t in out["tables"]])
    extras = {"builder": out["builder"], "tables": pairs} | {k: out[k] for k in ("q", "q_reference")}
    return Call(
        "ok", writes=writes, extras={k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in extras.items()}
    )


# --- in the parent: each pipeline in its child, then the matrix ------------------------------------------------


def run(names, device="cpu", timeout=TIMEOUT, progress=print, each_case=None, cases=None):
    """(results, outputs) of each named pipeline (NAME or NAME@VERSION) over `cases` (default CASES), each in a
    spawned child of its own: per pipeline its cases run, not run and its death (a crash or a call past
    `timeout`), its q path's semantics per dtype; its outputs per case (the Call's extras)."""
    cases = CASES if cases is None else cases
    prepared = {}
    progress("computing the reference tables")
    for case in cases:
        prepared[case.name] = inputs(case)
    results, outputs = [], []
    for name in dict.fromkeys(names):
        result = {"pipeline": name, "ran": [], "not_run": [], "writes": [], "builders": {}, "death": None}
        out = {}
        try:
            child = Child(Target(name, preset=name), PIPELINE.name, device, timeout)
        except LoadError as e:
            result["not_loaded"] = str(e)
            progress(f"pipeline {name}: not loaded ({e})")
            results.append(result)
            outputs.append(out)
            continue
        result["device_name"] = child.device_name
        try:
            for i, case in enumerate(cases, 1):
                if each_case:
                    each_case(f"pipeline {name} {i}/{len(cases)} {case.name}")
                try:
                    call_result = child.call(case, prepared[case.name])
                except ChildDied as e:
                    d = e.death
                    result["death"] = {"verdict": d.verdict, "reason": d.reason, "case": d.case, "call": d.direction}
                    break
                result["writes"] += [{"case": case.name} | w for w in call_result.writes]
                if call_result.status != "ok":
                    result["not_run"].append(
                        {"case": case.name, "status": call_result.status, "error": call_result.error}
                    )
                    continue
                out[case.name] = call_result.extras
                result["ran"].append(case.name)
                result["builders"].setdefault(case.dtype, [])
                if call_result.extras["builder"] not in result["builders"][case.dtype]:
                    result["builders"][case.dtype].append(call_result.extras["builder"])
        finally:
            child.stop()
        result["semantics"] = q_semantics(out, cases)
        progress(f"pipeline {name}: {len(result['ran'])} of {len(cases)} cases ran" + status_words(result))
        results.append(result)
        outputs.append(out)
    return results, outputs


def status_words(result: dict) -> str:
    """What kept a pipeline from running every case, in words ("" when nothing did)."""
    words = []
    if result.get("not_loaded"):
        words.append(f"not loaded: {result['not_loaded']}")
    if result["death"]:
        d = result["death"]
        words.append(f"{d['verdict']}: {d['reason']} in {d['case']}")
    if result["not_run"]:
        words.append(f"not run: {', '.join(sorted({n['status'] for n in result['not_run']}))}")
    if result["writes"]:
        words.append(f"writes into {', '.join(sorted({w['tensor'] for w in result['writes']}))}")
    return f" ({'; '.join(words)})" if words else ""


@functools.lru_cache(maxsize=32)
def emulated(case: PipelineCase) -> dict:
    """label -> the qnorm_rope forward emulation's output on a case, x and the reference tables (once per case,
    whatever the number of pipelines)."""
    p = inputs(case)
    emulations = QNORM_ROPE.emulations["forward"].items()
    return {label: e(p.x, p.cos, p.sin, case.rotary, case.eps) for label, e in emulations}


def q_semantics(out: dict, cases) -> dict:
    """dtype -> the qnorm_rope labels (semantics.classify) the q path's outputs on the reference tables carry,
    over the cases of the dtypes whose bits carry them (QNORM_ROPE.semantic_dtypes)."""
    found = {}
    for case in cases:
        if case.name in out and case.dtype in QNORM_ROPE.semantic_dtypes:
            got = out[case.name]["q_reference"]
            evidence = {label: semantics.agreement(got, e) for label, e in emulated(case).items()}
            found.setdefault(case.dtype, []).append(evidence)
    return {dtype: semantics.classify(evidence) for dtype, evidence in found.items()}


def compared(pairs_of_tensors) -> dict:
    """Bit comparison of tensors pairwise, merged: elements, the share bitwise equal, the largest ulp apart."""
    found = [bits_compare(a, b) for a, b in pairs_of_tensors]
    total = sum(c["elements"] for c in found)
    equal = sum(c["bitwise_equal"] * c["elements"] for c in found)
    return {
        "elements": total,
        "bitwise_equal": equal / total if total else 1.0,
        "max_ulp": max((c["max_ulp"] for c in found), default=0),
    }


def norms(labels: list[str] | None) -> set[str]:
    return {label for label in labels or () if label in semantics.NORMS}


def where_they_part(shares: dict, norms_a: set, norms_b: set) -> str:
    """The first stage of the path where two pipelines' bits part: `tables` (their tables differ), `norm` (the
    unrotated channels differ, or only the rotary ones do and their norm labels differ), `rotation` (only the
    rotary channels differ, under the same norm), `nowhere`."""
    if shares["tables"] < 1:
        return "tables"
    if shares["unrotated"] < 1 or shares["end_to_end_unrotated"] < 1:
        return "norm"
    if shares["rotary"] < 1 or shares["end_to_end"] < 1:
        return "norm" if norms_a and norms_b and norms_a != norms_b else "rotation"
    return "nowhere"


UNROTATED = HEAD_DIM - ROTARY
# what each share compares, from a case's outputs: the tables, the q paths on the reference tables (their
# unrotated channels, their rotary ones), end to end (the unrotated channels, and every channel)
PARTS_COMPARED = {
    "tables": lambda o: o["tables"],
    "unrotated": lambda o: o["q_reference"][..., :UNROTATED],
    "rotary": lambda o: o["q_reference"][..., UNROTATED:],
    "end_to_end_unrotated": lambda o: o["q"][..., :UNROTATED],
    "end_to_end": lambda o: o["q"],
}


def pairs(results: list[dict], outputs: list[dict], cases=None) -> list[dict]:
    """One row per pair of pipelines, case kind and dtype, over the cases both ran: the bitwise-equal shares of
    their tables, of their q paths on the reference tables (unrotated and rotary channels), end to end, the
    largest ulp distances, where their bits part first and the reason their labels give."""
    from dsrope_gate.parity import reason

    cases = CASES if cases is None else cases
    columns = list(dict.fromkeys((c.kind, c.dtype) for c in cases))
    rows = []
    for (ra, oa), (rb, ob) in itertools.combinations(zip(results, outputs, strict=True), 2):
        for kind, dtype in columns:
            row = {"a": ra["pipeline"], "b": rb["pipeline"], "kind": kind, "dtype": dtype}
            names = [c.name for c in cases if (c.kind, c.dtype) == (kind, dtype) and c.name in oa and c.name in ob]
            row["cases"] = len(names)
            if not names:
                rows.append(row | {"where": None, "reason": "no case of this kind and dtype ran on both"})
                continue
            a, b = [oa[n] for n in names], [ob[n] for n in names]
            found = {part: compared(zip(map(f, a), map(f, b), strict=True)) for part, f in PARTS_COMPARED.items()}
            shares = {part: c["bitwise_equal"] for part, c in found.items()}
            labels_a, labels_b = (r_["semantics"].get(dtype) for r_ in (ra, rb))
            row |= {part: shares[part] for part in ("tables", "unrotated", "rotary", "end_to_end")}
            row |= {"tables_max_ulp": found["tables"]["max_ulp"], "end_to_end_max_ulp": found["end_to_end"]["max_ulp"]}
            row["where"] = where_they_part(shares, norms(labels_a), norms(labels_b))
            row["reason"] = reason(labels_a, labels_b)
            rows.append(row)
    return rows


# --- the report ----------------------------------------------------------------------------------------------


def share_text(v) -> str:
    return "-" if v is None else ("100%" if v == 1 else f"{100 * v:.3f}%")


def render(rows: list[dict], results: list[dict], meta: dict) -> str:
    lines = [
        "# Pipelines: from positions to q",
        "",
        f"{meta['date']}; device {meta['device']}; torch {meta['torch']}; triton {meta['triton']}; {meta['cases']} "
        f"cases per pipeline (DeepSeek-V4 main and compress layers, x [B, {HEADS}, S, {HEAD_DIM}], rotary 64, "
        f"{' and '.join(DTYPES)})",
        "",
        "| pipeline | tables (per dtype) | q path | semantics of the q path (bf16) | cases run |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        builders = "; ".join(f"{d}: {', '.join(b)}" for d, b in r["builders"].items()) or "-"
        q = PIPELINES[r["pipeline"].partition("@")[0]]
        q_path = ("the contract's norm, then " if q.norm_first else "") + q.q
        labels = ", ".join(r.get("semantics", {}).get("bfloat16", [])) or "-"
        lines.append(f"| `{r['pipeline']}` | {builders} | {q_path} | {labels} | {len(r['ran'])}{status_words(r)} |")
    lines += [
        "",
        "Shares of bitwise-equal elements. Tables: the pairs' entries of cos and sin. On the reference tables: each "
        "q path on the contract's correctly rounded FP32 tables, its unrotated channels (the norm's) and its rotary "
        "ones. End to end: each q path on its own tables. Where: the first stage whose bits part.",
        "",
        "| A | B | case kind | dtype | tables | unrotated (reference tables) | rotary (reference tables) | end to end "
        "| max ulp end to end | where they part | reason (q path semantics) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["where"] is None:
            lines.append(f"| `{row['a']}` | `{row['b']}` | {row['kind']} | {row['dtype']} | {row['reason']} |||||||")
            continue
        cells = [share_text(row[k]) for k in ("tables", "unrotated", "rotary", "end_to_end")]
        lines.append(
            f"| `{row['a']}` | `{row['b']}` | {row['kind']} | {row['dtype']} | {' | '.join(cells)} | "
            f"{row['end_to_end_max_ulp']} | **{row['where']}** | {row['reason']} |"
        )
    return "\n".join(lines) + "\n"


def exit_status(results: list[dict]) -> int:
    """0 where every pipeline loaded and ran every case without a write into its inputs, else 1."""
    clean = all(not (r.get("not_loaded") or r["death"] or r["not_run"] or r["writes"]) for r in results)
    return 0 if results and clean else 1


def write(rows, results, meta, out, json_path, progress) -> str:
    """pipelines.md and pipelines.json into `out` (and the JSON to json_path); returns the markdown."""
    text = render(rows, results, meta)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pipelines.md").write_text(text)
    document = json.dumps({"meta": meta, "pipelines": results, "pairs": rows}, indent=1, default=str)
    for path in (out / "pipelines.json", json_path):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(document)
    progress(f"wrote {out / 'pipelines.md'}, pipelines.json")
    return text
