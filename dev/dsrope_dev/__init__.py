"""dsrope_dev: the project's own development tooling, kept out of the installed gate (dsrope_gate).

It lives in the repository only (dev/, on the path of the suite, of noxfile.py and of tools/) and is never
packaged: a user who installs dsrope[gate] to judge an implementation gets none of it. It may import the
gate, the kernels and the reference; none of them imports it (pyproject.toml, import contracts).

    mutation      the mutation gate: the runner (`python -m tools.mutants`) and its two catalogs as data
    bits          the baseline check: this tree's kernel bits against a commit's on this device (`nox -s bits`),
                  and the record of an intended change (`--record`)
    compile_cache the Triton specializations gpu-tests compiles before its workers start
    profile       a pytest plugin: where a gate's time goes
    gpu_pinning   one GPU per pytest-xdist worker
    perf_targets  the performance targets the bench checks on its rows
    peer_timing   bench --backward's table: cells not timed and why, markdown and legend
    timing        the GPU timing and yardsticks the bench and the tile sweep share
"""
