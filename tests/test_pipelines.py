"""Pipelines (dsrope_gate.pipelines): from the same positions, each project's tables then its q path, compared bit
by bit, on the CPU.

- the matrix of the CPU-capable pipelines (dsrope, transformers 5.17.0 and 5.23.0, sglang, nemo-automodel, vLLM,
  megatron-core) through the conformance command, every share pinned as measured (torch 2.13, triton 3.9's
  interpreter; DeepSeek-V4 main and compress layers, x [B, 4, S, 512] in bf16 and fp32): a peer release, or a
  change of an adapter or of the attribution, that moves a share or where a pair parts fails here;
- two pairs the field asks about part where they are known to: a trainer building its tables in the activations'
  dtype (transformers, bf16) against an engine's FP32 tables (sglang) parts at the tables; two q paths on the same
  FP32 tables, two-boundaries (dsrope) against fp32-through (sglang), part at the norm (the rotary channels alone
  show it, their norm labels differ); transformers 5.17.0 and 5.23.0 part nowhere on the CPU;
- veomni's kernels need CUDA: its pipeline raises on every case, is reported so and fails the exit status, and the
  others are compared without it;
- the attribution (where_they_part) and the shares (pairs) on made-up outputs, rejecting the wrong stage.
"""

from __future__ import annotations

import json

import pytest
import torch

from dsrope_gate import pipelines
from dsrope_gate.cli import main
from dsrope_gate.inputs import ON_GPU

DSROPE, SGLANG, NEMO, VLLM, MEGATRON = "dsrope", "sglang", "nemo-automodel", "vllm", "megatron-core"
HF517, HF523 = "transformers@5.17.0", "transformers@5.23.0"
NAMES = [DSROPE, HF517, HF523, SGLANG, NEMO, VLLM, MEGATRON, "veomni"]
COLUMNS = [("v4-main", "bfloat16"), ("v4-main", "float32"), ("v4-compress", "bfloat16"), ("v4-compress", "float32")]
# (A, B) -> per column of COLUMNS: shares bitwise equal (tables, unrotated and rotary channels of the q paths on the
# reference tables, end to end), rounded to 4 decimals, and where the bits part first, as measured. On the CPU,
# dsrope and sglang evaluate cos and sin through torch.polar, the others through torch.cos and torch.sin: a 1-ulp
# difference on about 4% of the FP32 entries (both inside the contract's model). vLLM's cache ends at position
# 2**20 - 1: its pairs leave out the far cases. megatron-core folds its YaRN attention factor (1.2773) into the
# compress tables.
PINNED = {
    (DSROPE, HF517): [
        (0.0213, 0.7549, 0.7413, 0.7336, "tables"),
        (0.9614, 0.8525, 0.8664, 0.8501, "tables"),
        (0.0585, 0.7271, 0.7077, 0.7082, "tables"),
        (0.9624, 0.8539, 0.8679, 0.8513, "tables"),
    ],
    (DSROPE, HF523): [
        (0.0213, 0.7549, 0.7413, 0.7336, "tables"),
        (0.9614, 0.8525, 0.8664, 0.8501, "tables"),
        (0.0585, 0.7271, 0.7077, 0.7082, "tables"),
        (0.9624, 0.8539, 0.8679, 0.8513, "tables"),
    ],
    (DSROPE, SGLANG): [
        (1.0, 1.0, 0.6956, 0.9619, "norm"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
        (1.0, 1.0, 0.7141, 0.9643, "norm"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
    ],
    (DSROPE, NEMO): [
        (0.0213, 1.0, 1.0, 0.9682, "tables"),
        (0.9614, 0.8525, 0.8664, 0.8501, "tables"),
        (0.0585, 1.0, 1.0, 0.9703, "tables"),
        (0.9624, 0.8539, 0.8679, 0.8513, "tables"),
    ],
    (DSROPE, VLLM): [
        (0.9619, 1.0, 0.702, 0.9628, "tables"),
        (0.9619, 1.0, 1.0, 0.9951, "tables"),
        (0.9653, 1.0, 0.7297, 0.9664, "tables"),
        (0.9653, 1.0, 1.0, 0.995, "tables"),
    ],
    (DSROPE, MEGATRON): [
        (0.9614, 1.0, 1.0, 1.0, "tables"),
        (0.9614, 0.8525, 0.8664, 0.8501, "tables"),
        (0.0106, 1.0, 1.0, 0.875, "tables"),
        (0.0106, 0.8539, 0.8679, 0.7471, "tables"),
    ],
    (HF517, HF523): [
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
    ],
    (HF517, SGLANG): [
        (0.0213, 0.7549, 0.6096, 0.7307, "tables"),
        (0.9614, 0.8525, 0.8664, 0.8501, "tables"),
        (0.0585, 0.7271, 0.6023, 0.7069, "tables"),
        (0.9624, 0.8539, 0.8679, 0.8513, "tables"),
    ],
    (HF517, NEMO): [
        (1.0, 0.7549, 0.7413, 0.7532, "norm"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
        (1.0, 0.727, 0.7077, 0.7247, "norm"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
    ],
    (HF517, VLLM): [
        (0.0312, 0.7414, 0.6055, 0.7189, "tables"),
        (1.0, 0.8302, 0.8456, 0.8321, "norm"),
        (0.0859, 0.7172, 0.6068, 0.6993, "tables"),
        (1.0, 0.8458, 0.8591, 0.8475, "norm"),
    ],
    (HF517, MEGATRON): [
        (0.0213, 0.7549, 0.7413, 0.7336, "tables"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
        (0.0106, 0.727, 0.7077, 0.6362, "tables"),
        (0.0106, 1.0, 1.0, 0.875, "tables"),
    ],
    (HF523, SGLANG): [
        (0.0213, 0.7549, 0.6096, 0.7307, "tables"),
        (0.9614, 0.8525, 0.8664, 0.8501, "tables"),
        (0.0585, 0.7271, 0.6023, 0.7069, "tables"),
        (0.9624, 0.8539, 0.8679, 0.8513, "tables"),
    ],
    (HF523, NEMO): [
        (1.0, 0.7549, 0.7413, 0.7532, "norm"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
        (1.0, 0.727, 0.7077, 0.7247, "norm"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
    ],
    (HF523, VLLM): [
        (0.0312, 0.7414, 0.6055, 0.7189, "tables"),
        (1.0, 0.8302, 0.8456, 0.8321, "norm"),
        (0.0859, 0.7172, 0.6068, 0.6993, "tables"),
        (1.0, 0.8458, 0.8591, 0.8475, "norm"),
    ],
    (HF523, MEGATRON): [
        (0.0213, 0.7549, 0.7413, 0.7336, "tables"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
        (0.0106, 0.727, 0.7077, 0.6362, "tables"),
        (0.0106, 1.0, 1.0, 0.875, "tables"),
    ],
    (SGLANG, NEMO): [
        (0.0213, 1.0, 0.6956, 0.954, "tables"),
        (0.9614, 0.8525, 0.8664, 0.8501, "tables"),
        (0.0585, 1.0, 0.7141, 0.9573, "tables"),
        (0.9624, 0.8539, 0.8679, 0.8513, "tables"),
    ],
    (SGLANG, VLLM): [
        (0.9619, 1.0, 1.0, 1.0, "tables"),
        (0.9619, 1.0, 1.0, 0.9951, "tables"),
        (0.9653, 1.0, 1.0, 1.0, "tables"),
        (0.9653, 1.0, 1.0, 0.995, "tables"),
    ],
    (SGLANG, MEGATRON): [
        (0.9614, 1.0, 0.6956, 0.9619, "tables"),
        (0.9614, 0.8525, 0.8664, 0.8501, "tables"),
        (0.0106, 1.0, 0.7141, 0.875, "tables"),
        (0.0106, 0.8539, 0.8679, 0.7471, "tables"),
    ],
    (NEMO, VLLM): [
        (0.0312, 1.0, 0.702, 0.9549, "tables"),
        (1.0, 0.8302, 0.8456, 0.8321, "norm"),
        (0.0859, 1.0, 0.7297, 0.96, "tables"),
        (1.0, 0.8458, 0.8591, 0.8475, "norm"),
    ],
    (NEMO, MEGATRON): [
        (0.0213, 1.0, 1.0, 0.9682, "tables"),
        (1.0, 1.0, 1.0, 1.0, "nowhere"),
        (0.0106, 1.0, 1.0, 0.875, "tables"),
        (0.0106, 1.0, 1.0, 0.875, "tables"),
    ],
    (VLLM, MEGATRON): [
        (1.0, 1.0, 0.702, 0.9628, "norm"),
        (1.0, 0.8302, 0.8456, 0.8321, "norm"),
        (0.0156, 1.0, 0.7297, 0.875, "tables"),
        (0.0156, 0.8458, 0.8591, 0.7401, "tables"),
    ],
}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """(exit status, the pipelines' results by name, the matrix's rows by pair and column, pipelines.md)."""
    out = tmp_path_factory.mktemp("pipelines")
    argv = ["--out", str(out), "--json", str(out / "p.json")]
    for name in NAMES:
        argv += ["--pipeline", name]
    rc = main(argv)
    document = json.loads((out / "p.json").read_text())
    rows = {(r["a"], r["b"], r["kind"], r["dtype"]): r for r in document["pairs"]}
    return rc, {r["pipeline"]: r for r in document["pipelines"]}, rows, (out / "pipelines.md").read_text()


def loaded(results, *names):
    missing = [n for n in names if results[n].get("not_loaded")]
    if missing:
        pytest.skip("; ".join(f"{n}: {results[n]['not_loaded']}" for n in missing))


@pytest.mark.long
@pytest.mark.skipif(ON_GPU, reason="CPU shares; the GPU's: tools/gpu_run.sh pipelines")
@pytest.mark.parametrize(("a", "b"), list(PINNED))
def test_pinned_pipeline_matrix(matrix, a, b):
    _, results, rows, _ = matrix
    loaded(results, a, b)
    got = []
    for kind, dtype in COLUMNS:
        r = rows[a, b, kind, dtype]
        got.append((*(round(r[k], 4) for k in ("tables", "unrotated", "rotary", "end_to_end")), r["where"]))
    assert got == PINNED[a, b], [(c, g) for c, g, p in zip(COLUMNS, got, PINNED[a, b], strict=True) if g != p]


@pytest.mark.long
@pytest.mark.skipif(ON_GPU, reason="CPU shares; the GPU's: tools/gpu_run.sh pipelines")
def test_a_trainers_bf16_tables_part_at_the_tables_and_two_norms_at_the_norm(matrix):
    _, results, rows, text = matrix
    loaded(results, HF517, SGLANG, DSROPE)
    trainer = rows[HF517, SGLANG, "v4-main", "bfloat16"]
    assert trainer["where"] == "tables" and trainer["tables"] < 0.05, trainer
    assert results[HF517]["builders"] == {
        "bfloat16": ["DeepseekV4RotaryEmbedding(bf16 activations)"],
        "float32": ["DeepseekV4RotaryEmbedding"],
    }
    norm = rows[DSROPE, SGLANG, "v4-main", "bfloat16"]
    assert (norm["tables"], norm["unrotated"], norm["where"]) == (1.0, 1.0, "norm") and norm["rotary"] < 0.8, norm
    assert norm["reason"] == "two-boundaries vs fp32-through"
    assert results[DSROPE]["semantics"]["bfloat16"][0] == "two-boundaries"
    assert results[SGLANG]["semantics"]["bfloat16"][0] == "fp32-through"
    # in fp32 boundary 1 rounds nothing: the same pair parts nowhere
    assert rows[DSROPE, SGLANG, "v4-main", "float32"]["where"] == "nowhere"
    assert "| `dsrope` | `sglang` | v4-main | bfloat16 | 100% | 100% | 69.556% | " in text, text


@pytest.mark.long
def test_a_pipeline_that_cannot_run_is_reported_and_fails_the_exit_status(matrix):
    rc, results, rows, text = matrix
    assert rc == 1
    veomni = results["veomni"]
    if veomni.get("not_loaded"):
        pytest.skip(veomni["not_loaded"])
    assert veomni["ran"] == [] and {n["status"] for n in veomni["not_run"]} == {"raised"}
    assert all(rows[a, "veomni", k, d]["where"] is None for a in NAMES[:-1] for k, d in COLUMNS)
    vllm = results[VLLM]
    assert sorted(n["case"] for n in vllm["not_run"]) == sorted(
        f"{kind}/far-{dtype}" for kind in ("v4-compress", "v4-main") for dtype in pipelines.DTYPES
    )
    assert rows[DSROPE, VLLM, "v4-main", "bfloat16"]["cases"] == 2
    assert "| `veomni` | - | the contract's norm, then apply_rotary_pos_emb_triton | - | 0 (not run: raised) |" in text


# --- the attribution and the shares, on made-up outputs -----------------------------------------------------------

CASE = pipelines.CASES[0]  # v4-main/start, bf16: x [1, 4, 16, 512]


def outputs(tables_bump=False, unrotated_bump=False, rotary_bump=False, own_only=False) -> dict:
    """One case's outputs, each stage's first element one ulp up where asked (own_only: end to end only)."""
    p = pipelines.inputs(CASE)
    q = p.x.clone()
    out = {"tables": torch.stack((p.cos[..., :32], p.sin[..., :32])), "q": q, "q_reference": q.clone()}
    bumped = out["q"] if own_only else out["q_reference"]
    up = lambda t: torch.nextafter(t, torch.full_like(t, float("inf")))  # noqa: E731
    if tables_bump:
        out["tables"][0, 0, 0, 0] = up(out["tables"][0, 0, 0, 0])
    if unrotated_bump:
        bumped[0, 0, 0, 0] = up(bumped[0, 0, 0, 0])
    if rotary_bump:
        bumped[0, 0, 0, -1] = up(bumped[0, 0, 0, -1])
    return out


def pair(a: dict, b: dict, labels_a=("two-boundaries", "interleaved"), labels_b=("two-boundaries", "interleaved")):
    results = [
        {"pipeline": name, "semantics": {"bfloat16": list(labels)}}
        for name, labels in (("a", labels_a), ("b", labels_b))
    ]
    (row,) = pipelines.pairs(results, [{CASE.name: a}, {CASE.name: b}], [CASE])
    return row


def test_the_first_stage_that_differs_is_named():
    n = CASE.table.batch * CASE.table.seq * pipelines.HEADS
    same = pair(outputs(), outputs())
    assert (same["where"], same["tables"], same["end_to_end"]) == ("nowhere", 1.0, 1.0)
    tables = pair(outputs(), outputs(tables_bump=True, unrotated_bump=True))
    share = lambda missed, elements: pytest.approx(1 - missed / elements, abs=1e-7)  # noqa: E731 (an FP32 mean)
    assert tables["where"] == "tables" and tables["tables"] == share(1, 2 * 16 * 32)
    norm = pair(outputs(), outputs(unrotated_bump=True, rotary_bump=True))
    assert norm["where"] == "norm" and norm["unrotated"] == share(1, n * 448) and norm["rotary"] == share(1, n * 64)
    assert pair(outputs(), outputs(unrotated_bump=True, own_only=True))["where"] == "norm"
    rotation = pair(outputs(), outputs(rotary_bump=True))
    assert (rotation["where"], rotation["unrotated"]) == ("rotation", 1.0)
    assert pair(outputs(), outputs(rotary_bump=True, own_only=True))["where"] == "rotation"
    # the rotary channels alone differ, under other norms: the norm's rounding before the rotation
    boundary = pair(outputs(), outputs(rotary_bump=True), labels_b=("fp32-through", "interleaved"))
    assert boundary["where"] == "norm" and boundary["reason"] == "two-boundaries vs fp32-through"
    # no norm label read (fp32, or no known semantics): the channels decide
    unread = pair(outputs(), outputs(rotary_bump=True), labels_b=())
    assert unread["where"] == "rotation"


def test_where_they_part_takes_the_first_stage_in_path_order():
    equal = dict.fromkeys(("tables", "unrotated", "rotary", "end_to_end_unrotated", "end_to_end"), 1.0)
    two, through = {"two-boundaries"}, {"fp32-through"}
    assert pipelines.where_they_part(equal, two, two) == "nowhere"
    assert pipelines.where_they_part(equal | {"tables": 0.5, "unrotated": 0.5}, two, through) == "tables"
    assert pipelines.where_they_part(equal | {"end_to_end_unrotated": 0.9}, two, two) == "norm"
    assert pipelines.where_they_part(equal | {"end_to_end": 0.9}, two, two) == "rotation"
    assert pipelines.where_they_part(equal | {"rotary": 0.9}, two, through) == "norm"
    assert pipelines.where_they_part(equal | {"rotary": 0.9}, set(), through) == "rotation"


def test_the_cases_and_the_reference_tables():
    """Main layers plain and compress layers YaRN (DeepSeek-V4's tables.CASES), each in bf16 and fp32; the
    reference tables are the contract's model's correctly rounded values, entries k >= R/2 NaN."""
    assert [c.name for c in pipelines.CASES[:2]] == ["v4-main/start-bfloat16", "v4-main/start-float32"]
    assert len(pipelines.CASES) == 12 and {c.kind for c in pipelines.CASES} == {"v4-main", "v4-compress"}
    p = pipelines.inputs(pipelines.CASES[6])
    assert pipelines.CASES[6].rope_scaling["factor"] == 16 and p.x.shape == (1, 4, 16, 512)
    assert p.x.dtype == torch.bfloat16 and p.x.transpose(1, 2).is_contiguous()
    from dsrope_reference.rope_tables import CPU_ULPS

    from dsrope_gate import tables

    cos_model, _ = tables.reference_model(pipelines.CASES[6].table, 1.0, CPU_ULPS)
    assert torch.equal(p.cos[..., :32].double(), cos_model.ref) and p.cos[..., 32:].isnan().all()


def test_pipeline_usage_errors(tmp_path, capsys):
    out = ["--out", str(tmp_path)]
    assert main(["--pipeline", "nobody", *out]) == 2
    assert "--pipeline: unknown 'nobody'" in capsys.readouterr().err
    assert main(["--pipeline", "transformers@5.20.0", *out]) == 2
    assert "transformers's pinned releases are ['5.17.0', '5.23.0']" in capsys.readouterr().err
    assert main(["--pipeline", "dsrope", "--in-process", *out]) == 2
    with pytest.raises(SystemExit):
        main(["--pipeline", "dsrope", "--preset", "sglang", *out])
    assert "--pipeline compares pipelines alone" in capsys.readouterr().err
