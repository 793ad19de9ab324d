"""Mutants of the conformance command (src/dsrope_gate/conformance/): the verdict, not-run and partial
handling, layout outcomes, writes into inputs, token-major detection, the --against comparison, the
report's fields, where the elements outside the model are (violations) and the named diagnosis
(dsrope_gate.diagnoses)."""

from __future__ import annotations

from dsrope_dev.mutation import CALLING, DIAGNOSES, JUDGING, RENDER, VIOLATIONS, mutant

MUTANTS = [
    mutant(
        "conformance.wrong_output_conforms",
        JUDGING,
        "verdict",
        "a case that returned a wrong shape or dtype does not count against the verdict",
        ('    if record["outside_model"] or wrong:\n', '    if record["outside_model"]:\n'),
    ),
    mutant(
        "conformance.nothing_judged_conforms",
        JUDGING,
        "verdict",
        "nothing judged (every case crashed or was refused) reads as conforming",
        ('    if not record["elements"]:\n        return "not run"\n', ""),
    ),
    mutant(
        "conformance.partial_reads_conforms",
        JUDGING,
        "verdict",
        "some cases not run: the verdict says conforms",
        ('return "partial" if record["not_run"] else "conforms"', 'return "conforms"'),
    ),
    mutant(
        "conformance.no_claim_is_false",
        JUDGING,
        "run_impl",
        "conforms is false (not null) where nothing was judged",
        ('.get(record["verdict"])', '.get(record["verdict"], False)'),
    ),
    mutant(
        "conformance.semantics_from_edge_values",
        JUDGING,
        "run_impl",
        "semantics read off the edge-value cases too (their bits carry reduction order, not semantics)",
        (
            "if case.evidence and case.dtype in op.semantic_dtypes and elements:",
            "if case.dtype in op.semantic_dtypes and elements:",
        ),
    ),
    mutant(
        "conformance.semantics_from_every_dtype",
        JUDGING,
        "run_impl",
        "semantics read off every dtype (qnorm_rope's fp32 bits carry the kernel's rstd, not its roundings)",
        ("if case.evidence and case.dtype in op.semantic_dtypes and elements:", "if case.evidence and elements:"),
    ),
    mutant(
        "conformance.last_violation_reported",
        JUDGING,
        "run_impl",
        "the reported violation is the last case's, not the first",
        ('if first and record["first_violation"] is None:', "if first:"),
    ),
    mutant(
        "conformance.wrong_values_accepted_layout",
        JUDGING,
        "run_impl",
        "a layout probe whose forward is outside the model reads accepted",
        (
            '                if direction == "forward" and outside:\n                    outcome = "silently wrong"\n',
            "",
        ),
    ),
    mutant(
        "conformance.writes_forgotten",
        JUDGING,
        "run_impl",
        "writes into the inputs are not collected",
        ("            wrote |= set(result.wrote)\n", ""),
    ),
    mutant(
        "conformance.backward_absent_when_forward_never_ran",
        JUDGING,
        "run_impl",
        "where no forward ran, the backward reads 'no backward (forward only)' instead of not run",
        (
            'res["backward"] = directions["backward"] if any_backward or not outputs else None',
            'res["backward"] = directions["backward"] if any_backward else None',
        ),
    ),
    mutant(
        "conformance.emulations_shared_by_directions",
        JUDGING,
        "shares",
        "the backward's shares are taken against the forward's emulations (one cache for both directions)",
        ("    if direction not in p.emulated:\n", "    if not p.emulated:\n"),
    ),
    mutant(
        "conformance.against_unweighted",
        JUDGING,
        "against",
        "--against's bitwise-equal share is a sum of per-case shares, not weighted by elements",
        (
            'equal = sum(c["bitwise_equal"] * c["elements"] for c in per_case)',
            'equal = sum(c["bitwise_equal"] for c in per_case)',
        ),
    ),
    mutant(
        "conformance.against_max_ulp_first_case",
        JUDGING,
        "against",
        "--against's largest distance is the first case's",
        ('"max_ulp": max(c["max_ulp"] for c in per_case),', '"max_ulp": per_case[0]["max_ulp"],'),
    ),
    mutant(
        "conformance.semantics_by_dtype_merged",
        JUDGING,
        "classify_by_dtype",
        "per-dtype semantics classify every dtype's cases together",
        (
            'return {dtype: classify([c for c in cases if c["dtype"] == dtype]) for dtype in dtypes}',
            "return {dtype: classify(cases) for dtype in dtypes}",
        ),
    ),
    mutant(
        "conformance.refusal_reads_crash",
        CALLING,
        "call",
        "an implementation refusing an input (ValueError, TypeError) is reported as crashed",
        (
            '        return Call("refused", error=error_line(e))\n',
            '        return Call("crashed", error=error_line(e))\n',
        ),
    ),
    mutant(
        "conformance.wrong_signature_reads_refused",
        CALLING,
        "call",
        "a callable that cannot take the op's arguments reads refused, as if it had said no to the input",
        ('        return Call("wrong signature", error=wrong)\n', '        return Call("refused", error=wrong)\n'),
    ),
    mutant(
        "conformance.wrong_output_reads_silently_wrong",
        JUDGING,
        "run_impl",
        "a layout probe that returned a wrong shape or None reads 'silently wrong' instead of 'wrong output'",
        (
            '        if case.kind == "probe":\n',
            '        if result.status == "wrong output":\n'
            '            outcome = "silently wrong"\n'
            '        if case.kind == "probe":\n',
        ),
    ),
    mutant(
        "conformance.gaps_not_watched",
        CALLING,
        "storage_bytes",
        "only an input's elements are watched for writes, not the bytes between them",
        (
            "    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).clone()",
            "    return t.detach().clone().contiguous().view(torch.uint8)",
        ),
    ),
    mutant(
        "conformance.token_major_is_contiguous",
        CALLING,
        "call",
        "an output is called token-major when it is contiguous head-major",
        ("token_major=out.transpose(1, 2).is_contiguous()", "token_major=out.is_contiguous()"),
    ),
    mutant(
        "conformance.backward_on_the_forward_tensors",
        CALLING,
        "call",
        "the backward's upstream gradient is the forward's output (the case's gradient unused)",
        ("torch.autograd.grad(y, x, inputs.grad)", "torch.autograd.grad(y, x, torch.ones_like(y))"),
    ),
    mutant(
        "conformance.report_says_conforms",
        RENDER,
        "verdict_table",
        "the report's verdict cell reads conforms for every verdict but 'does not conform'",
        ('.get(d["verdict"], d["verdict"])', '.get(d["verdict"], "conforms")'),
    ),
    mutant(
        "conformance.violations_grouped_by_gradient_rows",
        VIOLATIONS,
        "of_case",
        "a backward's elements outside the model are grouped by the magnitude of the gradient's rows, not x's",
        (
            "    rows = x_row_rms(p.inputs.x)\n",
            '    rows = x_row_rms(p.inputs.x if direction == "forward" else p.inputs.grad)\n',
        ),
    ),
    mutant(
        "conformance.diagnosis_from_one_case",
        VIOLATIONS,
        "summarize",
        "a diagnosis is named where it explains one case's elements outside the model, not every case's",
        ('all(d.name in c["explained_by"] for c in bad)', 'any(d.name in c["explained_by"] for c in bad)'),
    ),
    mutant(
        "conformance.underflow_rows_unchecked",
        DIAGNOSES,
        "rstd_cubed_underflows",
        "the rstd^3 underflow explains elements in rows of any magnitude (only the flushed model is checked)",
        ("    if not bool(underflow[outside].all()):\n        return False\n", ""),
    ),
    mutant(
        "conformance.underflow_without_subnormal_resolution",
        DIAGNOSES,
        "rstd_cubed_underflows",
        "the flushed model keeps r^3 exact to r's relative error: FP32's subnormal grid forgotten",
        ("    slack = SUBNORMAL_STEP / 2 + 3 * delta * cubed\n", "    slack = 3 * delta * cubed\n"),
    ),
]
