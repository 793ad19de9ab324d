"""dsrope_gate: the judgement of the dsrope project as a library.

It judges an implementation of the contract (docs/contract.md) against the FP64/mpmath reference
(dsrope_reference) under its per-element error model, on named cases and layouts, the golden inputs
and hypothesis-drawn ones. Modules (each imported on its own; this file imports nothing, so that an
entry point can choose compiled or interpreted Triton first: dsrope_gate.startup):

    layouts       Layout: any storage order, padding, steps, offset, stride 0; gaps hold NaN
    inputs        the device, the one cos/sin table maker, values, raw bits
    strategies    hypothesis strategies over shapes, layouts, values and tables
    differential  the eager chains of stock torch ops, transformers' DeepSeek-V3 functions
    cases         the golden cases: inputs from a seed, the reference's stages
    golden        the golden store: encoding, manifest and hashes, per-platform kernel snapshots, diffs
    report        the accuracy table and its chart;  verify: the accuracy report (tools/verify.py)
    profile       a pytest plugin: where a gate's time goes
    gpu_pinning   one GPU per pytest-xdist worker
    startup       compiled on a GPU, Triton's interpreter on CPU
    mutation      the mutation gate's runner; its catalog is data in mutation/catalog_*.py
"""
