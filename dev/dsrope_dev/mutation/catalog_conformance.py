"""Mutants of the conformance command (src/dsrope_gate/conformance/): the verdict, not-run and partial
handling, layout outcomes, writes into inputs, token-major detection, the --against comparison, the
report's fields, where the elements outside the model are (violations) and the named diagnosis
(dsrope_gate.diagnoses)."""

from __future__ import annotations

from dsrope_dev.mutation import (
    CALLING,
    CLI,
    CONFORMANCE,
    DIAGNOSES,
    ISOLATION,
    JUDGING,
    OPS,
    PARITY,
    PLUGIN,
    RENDER,
    STRATEGIES,
    TESTING,
    VIOLATIONS,
    mutant,
)

MUTANTS = [
    mutant(
        "conformance.wrong_output_conforms",
        JUDGING,
        "verdict",
        "a case that returned a wrong shape or dtype does not count against the verdict",
        (
            '    if (record["outside_model"] and not record.get("accepted")) or wrong or record["writes"]:\n',
            '    if (record["outside_model"] and not record.get("accepted")) or record["writes"]:\n',
        ),
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
        ('.get(record["verdict"], None)', '.get(record["verdict"], False)'),
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
        ('            directions[write["direction"]]["writes"].append({"case": case.name} | write)\n', ""),
    ),
    mutant(
        "conformance.backward_absent_when_forward_never_ran",
        JUDGING,
        "run_impl",
        "where no forward ran, the backward reads 'no backward (forward only)' instead of not run",
        (
            'res["backward"] = directions["backward"] if any_backward or not outputs or death else None',
            'res["backward"] = directions["backward"] if any_backward or death else None',
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
        "_forward",
        "an implementation refusing an input (ValueError, TypeError) is reported as raised",
        (
            '        return Call("refused", error=error_line(e))\n',
            '        return Call("raised", error=error_line(e))\n',
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
            "    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).cpu().clone()",
            "    return t.detach().cpu().clone().contiguous().view(torch.uint8)",
        ),
    ),
    mutant(
        "conformance.token_major_is_contiguous",
        CALLING,
        "_forward",
        "an output is called token-major when it is contiguous head-major",
        ("token_major = out.transpose(1, 2).is_contiguous()", "token_major = out.is_contiguous()"),
    ),
    mutant(
        "conformance.backward_on_the_forward_tensors",
        CALLING,
        "_backward",
        "the backward's upstream gradient is the forward's output (the case's gradient unused)",
        ("torch.autograd.grad(y, leaf, copies.grad)", "torch.autograd.grad(y, leaf, torch.ones_like(y))"),
    ),
    mutant(
        "conformance.report_says_conforms",
        RENDER,
        "verdict_table",
        "the report's verdict cell reads conforms for every verdict but 'does not conform'",
        (
            "            verdict = verdict_text(d, r)\n",
            '            verdict = "does not conform" if d["outside_model"] else "conforms"\n',
        ),
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
    # --- a verdict no other code can corrupt: fresh inputs, writes, in place, isolation -------------------------
    mutant(
        "conformance.inputs_not_copied",
        CALLING,
        "fresh",
        "an implementation is called on the case's own tensors: a write into cos reaches the next one",
        ("    return Inputs(*(same_layout_copy(t, device) for t in inputs))", "    return inputs"),
    ),
    mutant(
        "conformance.copy_onto_its_own_device_shared",
        CALLING,
        "same_layout_copy",
        "a copy onto the device the storage is on is the storage itself (.to() onto its own device copies nothing)",
        (
            "copy = storage.to(device=device) if elsewhere else storage.clone()",
            "copy = storage.to(device=device or storage.device)",
        ),
    ),
    mutant(
        "conformance.backward_writes_not_watched",
        CALLING,
        "_backward",
        "writes during the backward's calls (into the gradient, the tables, x) are not looked for",
        ("    result.writes += watch.writes()\n", ""),
    ),
    mutant(
        "conformance.in_place_gaps_not_watched",
        CALLING,
        "Watch._bytes",
        "an in-place x is not watched at all: a write between its elements passes",
        (
            "        return gaps_only(raw, t) if raw is not None and name in self.allowed else raw",
            "        return None if name in self.allowed else raw",
        ),
    ),
    mutant(
        "conformance.in_place_output_is_the_return",
        CALLING,
        "_forward",
        "an in-place implementation is judged by what it returns, not by what it wrote into x",
        ("    if in_place:\n        out = copies.x  # what it wrote into x is its output, whatever it returned\n", ""),
    ),
    mutant(
        "conformance.write_first_element_last",
        CALLING,
        "write_record",
        "the element reported for a write is the last changed one, not the first",
        ("    element = int(changed[0]) // t.element_size()", "    element = int(changed[-1]) // t.element_size()"),
    ),
    mutant(
        "conformance.death_forgets_finished_cases",
        JUDGING,
        "run_impl",
        "a child's death drops the cases it finished",
        (
            "            death = e.death\n            break\n",
            "            death = e.death\n"
            "            directions = {d: _direction() for d in directions}\n"
            "            break\n",
        ),
    ),
    mutant(
        "conformance.death_reads_partial",
        JUDGING,
        "verdict",
        "an implementation whose process died reads as its judged cases say (conforms or partial)",
        ("    if death is not None:\n        return death.verdict\n", ""),
    ),
    mutant(
        "conformance.timeout_reads_crashed",
        ISOLATION,
        "Death.verdict",
        "a call past its time limit reads crashed",
        (
            '        return "timed out" if self.reason.startswith("timed out") else "crashed"',
            '        return "crashed"',
        ),
    ),
    mutant(
        "conformance.signal_number_not_named",
        ISOLATION,
        "exit_reason",
        "a child killed by a signal reads as an exit status",
        ("    if code < 0:\n", "    if code < -100:\n"),
    ),
    mutant(
        "conformance.crash_reads_conforms_exit",
        CLI,
        "exit_status",
        "the command exits 0 when a direction crashed or timed out",
        (
            '    return 0 if verdicts and all(v == "conforms" for v in verdicts) else 1',
            '    return 0 if verdicts and all(v in ("conforms", "crashed", "timed out") for v in verdicts) else 1',
        ),
    ),
    mutant(
        "conformance.wrong_signature_exits_1",
        CLI,
        "exit_status",
        "a callable that cannot take the op's arguments exits 1 (not conforming), not 2 (a usage error)",
        ('        if statuses == {"wrong signature"}:\n            return 2\n', ""),
    ),
    mutant(
        "conformance.judge_failure_exits_1",
        CLI,
        "main",
        "the judge's own failure exits 1, which a CI reads as 'does not conform'",
        ("        traceback.print_exc()\n        return 3\n", "        traceback.print_exc()\n        return 1\n"),
    ),
    # --- the faces: assert_conforms, assert_bitwise_equal, the marker, parity, the groups, ops, strategies -------
    mutant(
        "conformance.assert_conforms_passes_partial",
        TESTING,
        "assert_conforms",
        "assert_conforms fails only a direction that does not conform: partial, not run, crashed pass",
        ('        if record["verdict"] != "conforms":\n', '        if record["verdict"] == "does not conform":\n'),
    ),
    mutant(
        "conformance.assert_conforms_backward_label_from_forward",
        TESTING,
        "assert_conforms",
        "a backward-only label is looked for in the forward's semantics",
        (
            '        direction = "forward" if label in forward_labels else "backward"\n',
            '        direction = "forward"\n',
        ),
    ),
    mutant(
        "conformance.assert_conforms_unknown_label_allowed",
        TESTING,
        "_check_labels",
        "an unknown semantics label is not a usage error (it fails as a semantics mismatch)",
        ("    if unknown:\n", "    if unknown and not wanted:\n"),
    ),
    mutant(
        "conformance.bitwise_equal_forward_only_by_default",
        TESTING,
        "assert_bitwise_equal",
        "assert_bitwise_equal compares the backward only when asked: its default skips it",
        ('        if direction == "backward" and not backward:\n', '        if direction == "backward":\n'),
    ),
    mutant(
        "conformance.bitwise_equal_cases_run_by_one",
        TESTING,
        "assert_bitwise_equal",
        "cases run by one implementation only are not a failure",
        ("    if only or not outputs_a:\n", "    if not outputs_a:\n"),
    ),
    mutant(
        "conformance.marker_drops_options",
        PLUGIN,
        "pytest_pyfunc_call",
        "the conforms marker passes the op but drops its options",
        ("    assert_conforms(fn, *marker.args, **marker.kwargs)", "    assert_conforms(fn, *marker.args)"),
    ),
    mutant(
        "conformance.marker_drops_backward",
        PLUGIN,
        "pytest_pyfunc_call",
        "the conforms marker drops its backward option",
        (
            "    assert_conforms(fn, *marker.args, **marker.kwargs)",
            '    assert_conforms(fn, *marker.args, **{k: v for k, v in marker.kwargs.items() if k != "backward"})',
        ),
    ),
    mutant(
        "conformance.testing_examples_ignored",
        TESTING,
        "_judge",
        "assert_conforms draws no case whatever `examples` asks",
        (
            "    cases = _prepared_cases(op.name, device, tuple(dtypes or ()), examples, golden, seed, contract)",
            "    cases = _prepared_cases(op.name, device, tuple(dtypes or ()), 0, golden, seed, contract)",
        ),
    ),
    mutant(
        "conformance.parity_reason_one_sided",
        PARITY,
        "reason",
        "a pair's reason names the labels of the first implementation on both sides",
        ('    return f"{named(only_a)} vs {named(only_b)}"', '    return f"{named(only_a)} vs {named(only_a)}"'),
    ),
    mutant(
        "conformance.parity_reason_swapped",
        PARITY,
        "reason",
        "a pair's reason reads from B's side",
        ('    return f"{named(only_a)} vs {named(only_b)}"', '    return f"{named(only_b)} vs {named(only_a)}"'),
    ),
    mutant(
        "conformance.decade_truncates",
        VIOLATIONS,
        "decade",
        "the decade of a row rms below 1 is truncated toward zero ([1e0, 1e1) for 0.5)",
        (
            "    e = math.floor(math.log10(rms)) if rms > 0 else None",
            "    e = int(math.log10(rms)) if rms > 0 else None",
        ),
    ),
    mutant(
        "conformance.groups_count_one_element_a_row",
        VIOLATIONS,
        "of_case",
        "a group counts one element judged per row, not the row's D",
        ('        group["elements"] += d\n', '        group["elements"] += 1\n'),
    ),
    mutant(
        "conformance.qnorm_semantics_in_fp32",
        OPS,
        "QNORM_ROPE",
        "qnorm_rope's fp32 bits are read for its semantics (they carry its rstd's reduction order)",
        ('    semantic_dtypes=("bfloat16", "float16"),\n', '    semantic_dtypes=("bfloat16", "float16", "float32"),\n'),
    ),
    mutant(
        "conformance.partial_rope_semantics_without_fp32",
        OPS,
        "PARTIAL_ROPE",
        "partial_rope's fp32 bits are not read for its semantics",
        ('    semantic_dtypes=("bfloat16", "float16", "float32"),\n', '    semantic_dtypes=("bfloat16", "float16"),\n'),
    ),
    mutant(
        "conformance.strategies_no_token_major_views",
        STRATEGIES,
        "cases",
        "x is never drawn as a view of a wider token-major buffer",
        ("    x_layout = draw(layouts(shape) | token_major_views())", "    x_layout = draw(layouts(shape))"),
    ),
    mutant(
        "conformance.strategies_no_steps",
        STRATEGIES,
        "layouts",
        "no layout is drawn with a step on a dim",
        (
            "    step = tuple(draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)))",
            "    step = tuple(draw(st.lists(st.integers(1, 1), min_size=n, max_size=n)))",
        ),
    ),
    mutant(
        "conformance.strategies_no_sum_gradient",
        STRATEGIES,
        "cases",
        "the gradient is never drawn with a stride 0",
        (
            "    grad_layout = draw(layouts(shape, broadcastable=(0, 1, 2, 3)) | token_major_views())",
            "    grad_layout = draw(layouts(shape) | token_major_views())",
        ),
    ),
    mutant(
        "conformance.accepted_ignored",
        JUDGING,
        "verdict",
        "elements an accepted diagnosis explains still fail the verdict",
        (
            '    if (record["outside_model"] and not record.get("accepted")) or wrong or record["writes"]:\n',
            '    if record["outside_model"] or wrong or record["writes"]:\n',
        ),
    ),
    mutant(
        "conformance.accept_without_a_diagnosis",
        JUDGING,
        "run_impl",
        "a direction is accepted when the user accepts anything, whether or not a diagnosis explains it",
        (
            '["outside_model"]} if named in accept else None',
            '["outside_model"]} if accept else None',
        ),
    ),
    # --- contracts as a parameter ----------------------------------------------------------------------------
    mutant(
        "conformance.contract_ignored_by_the_qnorm_reference",
        OPS,
        "_qnorm_reference",
        "qnorm_rope's forward is judged against the two-boundaries model whatever contract is asked",
        (
            "    fwd = contracts.forward(x, cos, sin, case.rotary, case.eps, contract)\n",
            "    fwd = contracts.forward(x, cos, sin, case.rotary, case.eps)\n",
        ),
    ),
    mutant(
        "conformance.contract_ignored_by_the_rope_reference",
        OPS,
        "_rope_reference",
        "partial_rope is judged against the two-boundaries model whatever contract is asked",
        (
            '        "out": partial_rope(x, cos, sin, case.rotary, contract=contract),\n',
            '        "out": partial_rope(x, cos, sin, case.rotary),\n',
        ),
    ),
    mutant(
        "conformance.golden_models_for_every_contract",
        CONFORMANCE,
        "golden_cases",
        "the golden cases keep their stored two-boundaries models under another contract",
        (
            "        if contract != DEFAULT_CONTRACT:\n"
            "            out.append(prepare(op, case, inputs, contract=contract))\n"
            "            continue\n",
            "",
        ),
    ),
]
