"""The kernels as torch.library custom ops: dsrope::partial_rope, dsrope::qnorm_rope and their
backward ops (src/dsrope/rope.py, src/dsrope/qnorm_rope.py).

- opcheck (schema, autograd registration, fake tensor against the real op, AOT dispatch) on every
  op over the layouts that matter: a token-major view, a contiguous head-major tensor, a padded
  view at a storage offset, and for the backward ops the stride-0 gradient of `.sum()`;
- the fake implementations give the real outputs' shape, dtype and strides (run on meta tensors);
- torch.compile(fullgraph=True) of the public functions (and of rope_utils' kernel paths) against
  the eager call: the same bits forward and backward, one graph holding our ops (no graph break),
  no recompile per sequence length with dynamic shapes, refused inputs refused before any launch.
  On CPU with backend aot_eager (dynamo and AOTAutograd, the graph run by the ops' real
  implementations in the interpreter); with inductor on CUDA (`gpu`);
- CUDA graph capture and replay, forward and backward, against eager (`gpu`).

Bit equality between eager and compiled calls needs the kernels to see the same layouts: a
kernel's reduction order may follow its input's layout on the GPU. Each comparison records the
layouts every launch saw (the `launches` fixture) and requires them equal too. AOTAutograd hands
the compiled backward its gradient with the output's strides when shapes are static and
contiguous when they are dynamic, so the tests pass gradients laid out that way.
"""

from __future__ import annotations

import pytest
import torch
from dsrope_reference.floats import bits
from torch._dynamo.testing import CompileCounterWithBackend

import dsrope.qnorm_rope
import dsrope.rope
from dsrope import apply_partial_rope_triton, qnorm_rope_triton
from dsrope.qnorm_rope import qnorm_rope, qnorm_rope_backward
from dsrope.rope import partial_rope, partial_rope_backward
from dsrope.rope_utils import apply_rotary_emb, apply_rotary_emb_qk, freqs_cis_from_position_ids, precompute_freqs_cis
from dsrope_gate.inputs import DEVICE, laid_out, tables, values
from dsrope_gate.layouts import TOKEN_MAJOR, Layout, layout_of

SHAPE, ROTARY, EPS = (2, 3, 5, 24), 8, 1e-6  # B, H, S, D: no two equal, so no size is guessed equal to another
LAYOUTS = {
    "token_major": TOKEN_MAJOR,
    "contiguous": Layout(),
    "padded_offset": Layout(order=(0, 2, 1, 3), pad=(1, 2, 1, 3), offset=5),
}
BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test compiles from scratch: no cache entry of another test decides what runs."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def launches(monkeypatch):
    """Records every launcher call: its name and the shape, strides and offset of each tensor."""
    calls = []

    def spy(module, name):
        real = getattr(module, name)

        def recording(*args, **kwargs):
            layouts = tuple((tuple(a.shape), a.stride(), a.storage_offset()) for a in args if torch.is_tensor(a))
            calls.append((name, layouts))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, recording)

    spy(dsrope.rope, "_launch")
    spy(dsrope.qnorm_rope, "_forward")
    spy(dsrope.qnorm_rope, "_backward")
    return calls


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


# --- opcheck and the fake implementations ------------------------------------------------------


OPS = {
    "partial_rope": partial_rope,
    "qnorm_rope": qnorm_rope,
    "partial_rope_backward": partial_rope_backward,
    "qnorm_rope_backward": qnorm_rope_backward,
}
# (op, layout): x's layout for the forward ops, the gradient's for the backward ops
OP_CASES = [(op, layout) for op in ("partial_rope", "qnorm_rope") for layout in LAYOUTS] + [
    (op, layout) for op in ("partial_rope_backward", "qnorm_rope_backward") for layout in (*LAYOUTS, "stride0")
]


def op_args(op: str, layout: str) -> tuple:
    """The op's arguments; forward ops get an x that requires grad. Built in the test, not at
    collection: a faulty kernel (a mutant) must fail a test, not crash the collection."""
    dtype = torch.bfloat16
    cos, sin = tables(SHAPE[0], SHAPE[2], ROTARY, seed=1)
    if op == "partial_rope":
        return laid_out(SHAPE, dtype, LAYOUTS[layout], seed=5).requires_grad_(), cos, sin, ROTARY
    if op == "qnorm_rope":
        return laid_out(SHAPE, dtype, LAYOUTS[layout], seed=5).requires_grad_(), cos, sin, ROTARY, EPS
    if layout == "stride0":
        g = values((), dtype, seed=4).to(DEVICE).expand(SHAPE)  # the gradient of .sum()
    else:
        g = laid_out(SHAPE, dtype, LAYOUTS[layout], seed=3)
    if op == "partial_rope_backward":
        return g, cos, sin, ROTARY
    x = laid_out(SHAPE, dtype, TOKEN_MAJOR, seed=2)
    return x, g, cos, sin, qnorm_rope(x, cos, sin, ROTARY, EPS)[1], ROTARY


@pytest.mark.parametrize("op,layout", OP_CASES, ids=[f"{op}-{layout}" for op, layout in OP_CASES])
def test_opcheck(op, layout):
    torch.library.opcheck(OPS[op], op_args(op, layout))


def on_meta(t):
    """t's shape, strides, offset and dtype on the meta device (no data)."""
    if not torch.is_tensor(t):
        return t
    extent = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1
    storage = torch.empty(extent, dtype=t.dtype, device="meta")
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


@pytest.mark.parametrize("op,layout", OP_CASES, ids=[f"{op}-{layout}" for op, layout in OP_CASES])
def test_fake_outputs_match_real(op, layout):
    """The fake implementation (what torch.compile plans with) against the real op: shape, dtype,
    strides, offset of every output; the output is token-major, rstd FP32 [B*S*H]."""
    args = op_args(op, layout)
    with torch.no_grad():
        real = OPS[op](*args)
        fake = OPS[op](*(on_meta(a) for a in args))
    real, fake = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
    assert fake[0].device.type == "meta"
    for r, f in zip(real, fake, strict=True):
        assert (f.shape, f.dtype, f.stride(), f.storage_offset()) == (r.shape, r.dtype, r.stride(), 0), layout_of(f)
    assert real[0].transpose(1, 2).is_contiguous(), layout_of(real[0])
    if op == "qnorm_rope":
        b, h, s, _ = SHAPE
        assert real[1].dtype == torch.float32 and real[1].shape == (b * s * h,)


# --- the eager paths and the op -----------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kernel", ["partial_rope", "qnorm_rope"])
def test_eager_paths_and_op_give_the_same_bits(kernel, layout):
    """The ways into a kernel give the same bits: the autograd.Function (a gradient is wanted; x is
    here a non-leaf view of the leaf, as when x comes from a projection), the launcher alone (no
    gradient: inference, decode), and the op called through the dispatcher with its registered
    autograd (what torch.compile calls). Backward: the Function's against the backward op's. eps is
    large against x's scale, so a path that dropped it would show."""
    eps = 1e-2
    x = laid_out(SHAPE, torch.bfloat16, LAYOUTS[layout], seed=70, scale=0.1)
    cos, sin = tables(SHAPE[0], SHAPE[2], ROTARY, seed=71)
    g = laid_out(SHAPE, torch.bfloat16, TOKEN_MAJOR, seed=72)
    if kernel == "partial_rope":
        public = lambda x: apply_partial_rope_triton(x, cos, sin, ROTARY)
        op = lambda x: partial_rope(x, cos, sin, ROTARY)
    else:
        public = lambda x: qnorm_rope_triton(x, cos, sin, ROTARY, eps)
        op = lambda x: qnorm_rope(x, cos, sin, ROTARY, eps)[0]
    with torch.no_grad():
        inference = public(x)
    leaf = x.detach().requires_grad_()
    trained = public(leaf[:])
    (dx,) = torch.autograd.grad(trained, leaf, g)
    leaf_op = x.detach().requires_grad_()
    via_op = op(leaf_op)
    (dx_op,) = torch.autograd.grad(via_op, leaf_op, g)
    assert inference.grad_fn is None
    assert type(trained.grad_fn).__name__ in ("_PartialRoPEBackward", "_QNormRoPEBackward")
    assert type(via_op.grad_fn).__name__.startswith("GeneratedBackwardFor_dsrope")
    assert same_bits(inference, trained) and same_bits(trained, via_op), "forward paths differ"
    assert same_bits(dx, dx_op), "backward paths differ"


# --- torch.compile against eager -------------------------------------------------------------


def case(kernel: str, seq: int, seed: int = 0):
    """(function, inputs that get a gradient, other inputs) for one kernel path at sequence length seq."""
    b, h, _, d = SHAPE
    if kernel in ("partial_rope", "qnorm_rope"):
        x = laid_out((b, h, seq, d), torch.bfloat16, TOKEN_MAJOR, seed=seed)
        cos, sin = tables(b, seq, ROTARY, seed=seed + 1)
        if kernel == "partial_rope":
            return (lambda x, cos, sin: apply_partial_rope_triton(x, cos, sin, ROTARY)), (x,), (cos, sin)
        return (lambda x, cos, sin: qnorm_rope_triton(x, cos, sin, ROTARY, EPS)), (x,), (cos, sin)
    freqs = precompute_freqs_cis(ROTARY, 4096, 10000.0, None)
    q = values((b, seq, h, ROTARY), torch.bfloat16, seed=seed).to(DEVICE)
    if kernel == "v3_cached_table":  # apply_rotary_emb, a table without grad: the kernel path
        positions = torch.randint(1, 4096, (b, seq), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        table = freqs_cis_from_position_ids(positions, freqs)
        return apply_rotary_emb, (q,), (table,)
    assert kernel == "v3_fused_qk"  # apply_rotary_emb_qk, rope_fusion=True, bshd
    k = values((b, seq, 1, ROTARY), torch.bfloat16, seed=seed + 1).to(DEVICE)
    table = freqs_cis_from_position_ids(torch.arange(seq, device=DEVICE)[None], freqs, for_fused_rope=True)
    return apply_rotary_emb_qk, (q, k), (table,)


KERNELS = ["partial_rope", "qnorm_rope", "v3_cached_table", "v3_fused_qk"]


def forward_backward(fn, diff, other, grads=None):
    """Outputs and input gradients of one call; grads(outputs) gives the upstream gradients."""
    diff = [t.detach().requires_grad_() for t in diff]
    outs = fn(*diff, *other)
    outs = outs if isinstance(outs, tuple) else (outs,)
    dxs = torch.autograd.grad(outs, diff, grads(outs))
    return outs, dxs


def like_outputs(seed):
    """Upstream gradients with each output's strides (what AOTAutograd expects for static shapes)."""
    return lambda outs: [torch.empty_like(o).copy_(values(o.shape, o.dtype, seed + i)) for i, o in enumerate(outs)]


def contiguous(seed):
    """Contiguous upstream gradients (what AOTAutograd expects when shapes are dynamic)."""
    return lambda outs: [values(o.shape, o.dtype, seed + i).to(o.device) for i, o in enumerate(outs)]


def assert_same(eager, compiled, what):
    for e, c in zip(eager, compiled, strict=True):
        assert same_bits(e, c), f"{what}: compiled differs from eager ({layout_of(e)} vs {layout_of(c)})"


LAYOUTS_DIFFER = (
    "the compiled call's kernels saw other layouts than the eager call's (if a gradient: does this torch's "
    "AOTAutograd expect another tangent layout than the test passes?)"
)


def our_ops(graph) -> set[str]:
    return {str(n.target) for n in graph.graph.nodes if str(n.target).startswith("dsrope.")}


def upstream_gradient_layouts(launches) -> list[tuple]:
    """(shape, strides, offset) of the upstream gradient each backward launch received."""
    backward = [layouts for name, layouts in launches if name == "_backward"]  # QNorm: (x, grad, ...)
    rotations = [layouts for name, layouts in launches if name == "_launch"]  # rope: forward, then grad
    return [layouts[1] for layouts in backward] or [layouts[0] for layouts in rotations[1::2]]


def in_layouts(seed, layouts):
    """The upstream gradients of like_outputs(seed), stored with the given (shape, strides, offset)."""

    def grads(outs):
        out = []
        for g, (shape, stride, offset) in zip(like_outputs(seed)(outs), layouts, strict=True):
            storage = torch.empty(
                offset + sum((n - 1) * st for n, st in zip(shape, stride, strict=True)) + 1,
                dtype=g.dtype,
                device=g.device,
            )
            out.append(storage.as_strided(shape, stride, offset).copy_(g))
        return out

    return grads


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_compiled_matches_eager_bitwise(kernel, backend, launches):
    """fullgraph: one graph with our op and no break; outputs and gradients bit-identical to the
    eager call given the same inputs. AOTAutograd may hand the compiled backward the upstream
    gradient in a layout of its own (torch 2.11 makes a token-major one contiguous; 2.13 keeps it),
    and the QNorm backward's row sum may follow the layout: so the eager call gets the same gradient
    values in the layout the compiled backward received, and every launch must then see the same
    layouts as in the compiled call."""
    fn, diff, other = case(kernel, SHAPE[2], seed=10)
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    out, dx = forward_backward(compiled, diff, other, like_outputs(20))
    compiled_launches = list(launches)
    launches.clear()
    # the V3 paths' outputs are contiguous [B, S, H, d]: AOTAutograd keeps that layout on every torch
    direct = kernel in ("partial_rope", "qnorm_rope")
    grads = in_layouts(20, upstream_gradient_layouts(compiled_launches)) if direct else like_outputs(20)
    eager_out, eager_dx = forward_backward(fn, diff, other, grads)
    assert counter.frame_count == 1
    expected = {"dsrope.qnorm_rope.default"} if kernel == "qnorm_rope" else {"dsrope.partial_rope.default"}
    assert our_ops(counter.graphs[0]) == expected
    assert launches == compiled_launches, LAYOUTS_DIFFER
    assert_same(eager_out, out, f"{kernel} forward")
    assert_same(eager_dx, dx, f"{kernel} backward")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel", ["partial_rope", "qnorm_rope", "v3_fused_qk"])
def test_dynamic_sequence_length_compiles_once(kernel, backend, launches):
    """dynamic=True: the first length compiles, the next two reuse the graph (a recompile raises
    under error_on_recompile); each bit-identical to eager."""
    counter = CompileCounterWithBackend(backend)
    compiled, compiles = None, None
    for seq in (5, 7, 11):
        fn, diff, other = case(kernel, seq, seed=seq)
        compiled = compiled or torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
        launches.clear()
        eager_out, eager_dx = forward_backward(fn, diff, other, contiguous(seq))
        eager_launches = list(launches)
        launches.clear()
        with torch._dynamo.config.patch(error_on_recompile=compiles is not None):
            out, dx = forward_backward(compiled, diff, other, contiguous(seq))
        compiles = compiles or counter.frame_count
        assert launches == eager_launches, LAYOUTS_DIFFER
        assert_same(eager_out, out, f"{kernel} S={seq} forward")
        assert_same(eager_dx, dx, f"{kernel} S={seq} backward")
    # a restarted analysis (dynamo tensorifying the float eps, then specializing it) counts twice
    assert counter.frame_count == compiles
    assert our_ops(counter.graphs[-1]) in ({"dsrope.qnorm_rope.default"}, {"dsrope.partial_rope.default"})


def test_compiled_inference_call_uses_the_op(launches):
    """Under no_grad (decode) the compiled graph still holds the op, and gives eager's bits."""
    fn, (x,), other = case("qnorm_rope", SHAPE[2], seed=30)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    with torch.no_grad():
        eager, out = fn(x, *other), compiled(x, *other)
    assert our_ops(counter.graphs[0]) == {"dsrope.qnorm_rope.default"}
    assert same_bits(eager, out) and len(launches) == 2


REFUSED = [
    ("rotary", dict(rotary=7), ValueError, "rotary: expected a positive even int"),
    ("eps", dict(eps=-1.0), ValueError, "eps: expected a finite float > 0"),
    ("cos", dict(cos_dtype=torch.float64), TypeError, "cos: expected dtype float32"),
]


@pytest.mark.parametrize("arg,change,error,words", REFUSED, ids=[r[0] for r in REFUSED])
def test_compiled_call_refuses_before_launch(arg, change, error, words, launches):
    """A refused input under torch.compile: the checks run while dynamo traces, before any launch.
    Without fullgraph the frame falls back to eager and the same error is raised; with fullgraph
    dynamo cannot put a raise in a graph and reports it as a compile error (torch._dynamo.exc)."""
    x = laid_out(SHAPE, torch.bfloat16, TOKEN_MAJOR, seed=40)
    cos, sin = tables(SHAPE[0], SHAPE[2], ROTARY, seed=41)
    kwargs = dict(rotary=ROTARY, eps=EPS) | change
    cos = cos.to(kwargs.pop("cos_dtype", torch.float32))

    def fn(x, cos, sin, rotary, eps):
        return qnorm_rope_triton(x, cos, sin, rotary, eps)

    with pytest.raises(error, match=words):
        torch.compile(fn, backend="aot_eager")(x, cos, sin, **kwargs)
    torch._dynamo.reset()  # else the fullgraph compile below reuses the cache entry of the one above
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):
        torch.compile(fn, backend="aot_eager", fullgraph=True)(x, cos, sin, **kwargs)
    assert launches == []


# --- CUDA graphs -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["partial_rope", "qnorm_rope", "v3_fused_qk"])
@pytest.mark.parametrize("with_backward", [False, True], ids=["forward_no_grad", "forward_backward"])
def test_cuda_graph_replay_matches_eager(kernel, with_backward):
    """Capture one call (the inference path, or forward + backward), replay it on new values:
    bit-identical to eager calls on those values."""
    fn, diff, other = case(kernel, 33, seed=50)
    static = [t.detach().clone().requires_grad_(with_backward) for t in diff]
    grads_of = like_outputs(51)
    with torch.no_grad():
        probe = fn(*static, *other)
    static_grads = grads_of(probe if isinstance(probe, tuple) else (probe,))

    def step():
        outs = fn(*static, *other)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return outs, (torch.autograd.grad(outs, static, static_grads) if with_backward else ())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compiles the kernels, fills the caching allocator
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_outs, captured_dxs = step()

    for seed in (52, 53):
        _, new_diff, _ = case(kernel, 33, seed=seed)
        with torch.no_grad():
            for s, n in zip(static, new_diff, strict=True):
                s.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        fresh = [t.detach().clone().requires_grad_(with_backward) for t in new_diff]
        outs = fn(*fresh, *other)
        outs = outs if isinstance(outs, tuple) else (outs,)
        assert_same(outs, captured_outs, f"{kernel} replayed forward")
        if with_backward:
            assert_same(torch.autograd.grad(outs, fresh, static_grads), captured_dxs, f"{kernel} replayed backward")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["partial_rope", "qnorm_rope"])
def test_decode_shape_compiles_and_replays(kernel):
    """A decode row of the benchmark (S=1, D=512, R=64, per-sequence positions), inference: the
    inductor-compiled call and a CUDA graph replay of the eager call, each bit-identical to eager."""
    b, h, d, r = 8, 128, 512, 64
    x = torch.randn(b, 1, h, d, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = tables(b, 1, r, seed=60, per_batch=True)
    if kernel == "qnorm_rope":
        fn = lambda x: qnorm_rope_triton(x, cos, sin, r, EPS)
    else:
        fn = lambda x: apply_partial_rope_triton(x, cos, sin, r)
    eager = fn(x)
    assert same_bits(eager, torch.compile(fn, fullgraph=True)(x))
    static = x.clone()
    fn(static)  # compiles the kernel outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(static)
    graph.replay()
    torch.cuda.synchronize()
    assert same_bits(eager, captured)


def test_forward_mode_ad_is_refused_not_dropped():
    """A dual tensor does not require grad; the eager fast path must not take it and silently lose its
    tangent: the Function (no jvp) refuses it, as before the fast path existed."""
    import torch.autograd.forward_ad as fwAD

    fn, (x,), other = case("qnorm_rope", SHAPE[2], seed=40)
    rope, (xr,), other_r = case("partial_rope", SHAPE[2], seed=41)
    with fwAD.dual_level():
        for f, t, rest in ((fn, x, other), (rope, xr, other_r)):
            dual = fwAD.make_dual(t, torch.ones_like(t))
            with pytest.raises(RuntimeError, match="jvp"):
                f(dual, *rest)
