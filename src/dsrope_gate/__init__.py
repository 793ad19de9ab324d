"""dsrope_gate: the judgement of the dsrope project as a library.

It judges an implementation of the contract (docs/contract.md) against the FP64/mpmath reference
(dsrope_reference) under its per-element error model, on named cases and layouts, the golden inputs
and hypothesis-drawn ones. Modules (each imported on its own; this file imports nothing, so that an
entry point can choose compiled or interpreted Triton first: dsrope_gate.startup):

    ops           one record per op: call convention, reference stages, emulations, contract labels
    cases         the one Case type (values Drawn or Seeded, a Layout per tensor)
    case_sets     the golden cases, the canonical heads, one probe per layout class, the seeded sweep
    layouts       Layout: any storage order, padding, steps, offset, stride 0; gaps hold NaN
    inputs        the device, the one cos/sin table maker, values
    strategies    hypothesis strategies over shapes, layouts, values and tables
    differential  the eager chains of stock torch ops, transformers' DeepSeek-V3 functions
    semantics     the one FP32 eager rotation, the known semantics' emulations, the classifier
    tables        the rope_tables op: cases, table semantics labels and emulations, the judge of a table builder
    table_builders  adapters over the pinned projects' table builders and dsrope's own
    diagnoses     named causes of elements outside the model (explain, never change a verdict)
    targets       loading an implementation (module:callable, file.py:callable); the module loader
    golden        the golden store: records, encoding, manifest and hashes, snapshot files, diffs
    snapshots     dsrope's kernels on the golden inputs; per-platform kernel bit snapshots
    report        the accuracy table and its chart;  verify: the accuracy report (tools/verify.py)
    conformance   the conformance command: calling, judging, violations, render, cli (exit status 0 / 1 / 2)
    testing       assert_conforms, assert_bitwise_equal: the judgement as assertions for any test suite
    pytest_plugin the pytest11 entry point: the `conforms` marker and the `judge` fixture
    presets       adapters over the peers' pinned releases
    pins          the peers' pinned releases, one name==version each (no imports: the noxfile reads it too)
    startup       compiled on a GPU, Triton's interpreter on CPU

The project's own development tooling (the mutation gate, the compile cache, profiling, GPU pinning, the
bench's targets and tables) is dsrope_dev, in the repository's dev/ folder, and is not installed with this.
"""
