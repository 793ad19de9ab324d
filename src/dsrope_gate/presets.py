"""Presets: the DeepSeek-V4 rope code the field runs, each behind an adapter with the contract's
signature, for the conformance command (`--preset NAME`) and the benchmark (`--peers`).

Every adapter imports the real code of a pinned release (never a copy of it) and maps our convention
onto theirs: x [B, H, S, D] of any strides, cos/sin FP32 [B, S, R] whose first R/2 entries are the pairs'
(theirs take R/2-entry, complex, batch-less or duplicated tables), the trailing R channels rotated as
interleaved pairs. Their math is never changed: where their function is in place it runs on a copy of x
in token-major storage and the copy is returned; where it has no backward of its own the result carries
no grad_fn (the command then reports the forward only). The rope tables a project builds from positions are
its table builders (dsrope_gate.table_builders, under the same preset names).

Where a package cannot be imported whole without its heavy runtime, the adapter loads its one module:
sglang (a serving runtime) from the installed distribution's file, flash-attn (an sdist that builds a
CUDA extension) from the release's archive, megatron-core (a wheel for Python >= 3.12 whose package
imports its runtime) and vLLM (a serving runtime; a few files, with stand-ins for the rest of it) from the
release's wheel, extracted at first use into a cache outside the repository (DSROPE_PEERS_CACHE, default
~/.cache/dsrope/peers). A preset whose package is missing is skipped with the command that installs it.

`NAME@VERSION` names a release: the pinned one, or one pinned beside it (PINS["NAME@VERSION"]), installed
alone into its own folder of the cache and put first on sys.path before its package is imported. Two
releases of one package cannot share a process: each is loaded in a process of its own.

    python -m dsrope_gate.presets fetch [DIR]    # the pinned wheels and modules into DIR (default
                                                 # .whl/peers), for an offline GPU host
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
import types
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dsrope_gate.ops import PARTIAL_ROPE, QNORM_ROPE, Op
from dsrope_gate.pins import PINS, release, version
from dsrope_gate.targets import load_module

CACHE = Path(os.environ.get("DSROPE_PEERS_CACHE", Path.home() / ".cache" / "dsrope" / "peers"))


@dataclass(frozen=True)
class Implementation:
    """One preset's function for one op, with the contract's signature (`op.signature`), and what else its
    adapter offers the benchmark, declared here (None: not offered):

    in_place(x, cos, sin, rotary) -> x: their in-place call on x itself (a view of token-major storage): the
        rotary channels of x rotated, nothing copied;
    prepare_in_place(x, cos, sin, rotary) -> call: their in-place function alone, with its arguments (tables
        in their convention) made beforehand: call() is what a user holding such tables would run.

    And what it is, for the benchmark's tables: `backward`, how fn's result gets its gradient (None: forward
    only, the result carries no grad_fn; tests/test_presets.py holds each to that); `offsets_32bit`, whether
    their kernel forms element offsets in 32 bits (program id times a stride), so that past 2**31 elements
    it addresses wrong memory: the benchmark does not run it there (a fault poisons the CUDA context).
    """

    name: str
    op: Op
    fn: Callable
    in_place: Callable | None = None
    prepare_in_place: Callable | None = None
    backward: str | None = None
    offsets_32bit: bool = False


class Missing(Exception):
    """A preset's package is not installed: the message says how to install it."""


class VersionConflict(RuntimeError):
    """A preset's release cannot load in this process: another release of its package is imported here
    (two releases of one package cannot share a process)."""


def releases(preset: str) -> list[str]:
    """The versions `preset@VERSION` may name: its pinned release first, then those pinned beside it
    (PINS["NAME@VERSION"]); none for a preset without a pin."""
    if preset not in PINS:
        return []
    return [version(preset)] + [key.partition("@")[2] for key in PINS if key.startswith(f"{preset}@")]


def _require(name: str, at: str | None = None) -> None:
    """The distribution `name` found first on sys.path is the pinned release (or release `at`, pinned beside it)."""
    pin = PINS[f"{name}@{at}"] if at and at != version(name) else PINS[name]
    try:
        found = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        raise Missing(f"{name} is not installed: `pip install --no-deps {pin}`") from None
    if found != pin.split("==")[1]:
        raise Missing(f"{name} {found} is installed, the preset is pinned to {pin}: `pip install --no-deps {pin}`")


def _release_folder(package: str, at: str) -> Path:
    """CACHE/PACKAGE-VERSION: the release installed alone (no dependencies) into its own folder, from the
    wheel `fetch` carried there for an offline host, else from the package index, at first use."""
    folder = CACHE / f"{package}-{at}"
    pin = PINS[f"{package}@{at}"]
    if not (folder / package).is_dir():
        wheels = sorted(folder.glob("*.whl"))
        source = ["--no-index", str(wheels[-1])] if wheels else [pin]
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(folder)]
        subprocess.run(cmd + source, capture_output=True)
    if not (folder / package).is_dir():
        raise Missing(f"{package} {at} is not in {folder}: `pip install --no-deps --target {folder} {pin}`")
    return folder


def use_release(package: str, at: str | None = None) -> None:
    """Make `import PACKAGE` give release `at` in this process (None: the pinned one, installed as usual).
    A release pinned beside it (PINS["PACKAGE@VERSION"]) has its own folder (_release_folder), put first
    on sys.path and imported at once. Raises VersionConflict when another release of the package is
    already imported in this process: each release is judged in a process of its own."""
    wanted = at or version(package)
    imported = sys.modules.get(package)
    if imported is not None:
        found = getattr(imported, "__version__", None)
        if found != wanted:
            raise VersionConflict(
                f"{package}@{wanted}: {package} {found} is already imported in this process (from "
                f"{Path(imported.__file__).parent}); two releases of one package cannot share a process: "
                f"load {package}@{wanted} in a fresh one"
            )
        return
    if wanted == version(package):
        return
    folder = str(_release_folder(package, wanted))
    if folder not in sys.path:
        sys.path.insert(0, folder)
        importlib.invalidate_caches()
    found = importlib.import_module(package).__version__
    if found != wanted:
        raise VersionConflict(f"{package}@{wanted}: importing {package} from {folder} gave {found}")


def _half(t):
    """Our [B, S, R] table's pair entries [B, S, R/2]."""
    return t[..., : t.shape[-1] // 2]


def _token_major_copy(x):
    """A copy of x (always new storage) in token-major layout, as its contiguous [B, S, H, D] view."""
    import torch

    return x.detach().transpose(1, 2).clone(memory_format=torch.contiguous_format)


# --- controls ------------------------------------------------------------------------------------------


def dsrope_preset():
    import torch

    import dsrope

    def in_place_on_copy(x, cos, sin, rotary):
        """apply_partial_rope_triton_ on a token-major copy of x (autograd carries the gradient to x)."""
        y = x.transpose(1, 2).clone(memory_format=torch.contiguous_format).transpose(1, 2)
        return dsrope.apply_partial_rope_triton_(y, cos, sin, rotary)

    ours = "dsrope's Triton backward kernel (its custom op's autograd)"
    return [
        Implementation("dsrope:qnorm_rope_triton", QNORM_ROPE, dsrope.qnorm_rope_triton, backward=ours),
        Implementation(
            "dsrope:apply_partial_rope_triton", PARTIAL_ROPE, dsrope.apply_partial_rope_triton, backward=ours
        ),
        Implementation(
            "dsrope:apply_partial_rope_triton_", PARTIAL_ROPE, in_place_on_copy, backward=f"{ours}, through the copy"
        ),
    ]


def eager_chain_preset():
    autograd = "autograd through the torch ops"
    return [
        Implementation("eager-chain:F.rms_norm+fp32-rotation", QNORM_ROPE, QNORM_ROPE.eager, backward=autograd),
        Implementation("eager-chain:fp32-rotation", PARTIAL_ROPE, PARTIAL_ROPE.eager, backward=autograd),
    ]


# --- transformers: models/deepseek_v4 (eager) --------------------------------------------------------------


def transformers_preset(at: str | None = None):
    """apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1) takes R/2-entry tables [B, S, R/2] and rotates the
    trailing 2 * (R/2) channels (pairs 2k, 2k+1 by repeat_interleave and their rotate_half) in FP32;
    DeepseekV4UnweightedRMSNorm(eps) is their Q norm. Our FP32 tables' pair entries are passed as they are.
    `at`: a release pinned beside the installed one (transformers@VERSION), made importable first
    (use_release)."""
    _require("transformers", at)
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    def rotate(x, cos, sin, rotary):
        return m.apply_rotary_pos_emb(x, _half(cos), _half(sin), unsqueeze_dim=1)

    def qnorm_rotate(x, cos, sin, rotary, eps):
        return m.apply_rotary_pos_emb(m.DeepseekV4UnweightedRMSNorm(eps)(x), _half(cos), _half(sin), unsqueeze_dim=1)

    autograd = "autograd through their eager torch ops"
    return [
        Implementation("transformers:apply_rotary_pos_emb", PARTIAL_ROPE, rotate, backward=autograd),
        Implementation(
            "transformers:DeepseekV4UnweightedRMSNorm+apply_rotary_pos_emb", QNORM_ROPE, qnorm_rotate,
            backward=autograd,
        ),
    ]  # fmt: skip


# --- veomni: ops/kernels/rotary/triton_deepseek_v4.py (Triton, with backward) --------------------------------


def veomni_preset():
    """apply_rotary_pos_emb_triton(x [B, H, S, D], cos, sin [B, S, R/2]): their autograd Function around
    their Triton kernel. Its public guard sends CPU tensors to transformers' eager function, so the adapter
    calls the Function the guard calls on CUDA (on CPU: their kernel in Triton's interpreter)."""
    _require("veomni")
    module = importlib.import_module("veomni.ops.kernels.rotary.triton_deepseek_v4")

    def rotate(x, cos, sin, rotary):
        if x.is_cuda:
            return module.apply_rotary_pos_emb_triton(x, _half(cos), _half(sin), unsqueeze_dim=1)
        return module._ApplyRotaryPosEmbTriton.apply(x, _half(cos), _half(sin))

    return [
        Implementation(
            "veomni:apply_rotary_pos_emb_triton", PARTIAL_ROPE, rotate,
            backward="their autograd Function: their Triton backward kernel", offsets_32bit=True,
        )
    ]  # fmt: skip


# --- sglang: kernels/ops/attention/dsv4/rope.py (Triton, in place, forward only) -------------------------------


SGLANG_MODULE = "sglang/kernels/ops/attention/dsv4/rope.py"


def _sglang_module():
    """From the installed distribution; else the same file of the release carried to an offline host
    (`fetch` puts it under CACHE/sglang-<version>/)."""
    carried = CACHE / release("sglang") / SGLANG_MODULE
    try:
        _require("sglang")
        path = Path(importlib.metadata.distribution("sglang").locate_file(SGLANG_MODULE))
    except Missing:
        if not carried.is_file():
            raise
        path = carried
    return load_module("_dsrope_peer_sglang_dsv4_rope", path)


def _complex_rows(cos, sin):
    """Our tables as sglang's complex64 freqs_cis, one row per token (b, s): [B*S, R/2]."""
    import torch

    return torch.complex(_half(cos).float(), _half(sin).float()).reshape(-1, cos.shape[-1] // 2)


def sglang_preset():
    """The one module, loaded from the installed distribution (importing sglang whole starts its serving
    runtime). apply_rotary_emb_triton(x [M, H, R], freqs_cis [M, R/2]) rotates in place: it gets the rotary
    slice of a token-major copy of x, M = B*S tokens. fused_norm_rope_inplace_triton(kv [M, D], None, eps,
    freqs_cis, positions) normalizes (no weight) and rotates the last R channels in place: it gets a
    token-major copy of x as B*S*H rows, with each row's token as its position in the [B*S, R/2] table.
    Both are forward only: the results carry no grad_fn."""
    import torch

    module = _sglang_module()

    def in_place(x, cos, sin, rotary):
        """Their in-place call on x itself (a view of token-major storage), for the benchmark."""
        b, h, s, d = x.shape
        module.apply_rotary_emb_triton(x.transpose(1, 2).view(b * s, h, d)[..., d - rotary :], _complex_rows(cos, sin))
        return x

    def rotate(x, cos, sin, rotary):
        return in_place(_token_major_copy(x).transpose(1, 2), cos, sin, rotary)

    def qnorm_rotate(x, cos, sin, rotary, eps):
        b, h, s, d = x.shape
        y = _token_major_copy(x)
        positions = torch.arange(b * s, device=x.device).repeat_interleave(h)
        module.fused_norm_rope_inplace_triton(y.view(-1, d), None, eps, _complex_rows(cos, sin), positions)
        return y.transpose(1, 2)

    return [
        Implementation("sglang:apply_rotary_emb_triton", PARTIAL_ROPE, rotate, in_place=in_place, offsets_32bit=True),
        Implementation("sglang:fused_norm_rope_inplace_triton", QNORM_ROPE, qnorm_rotate, offsets_32bit=True),
    ]


def sglang_batched_preset():
    """sglang's batched rope, the path its DeepSeek-V4 model takes (srt/models/deepseek_v4.py calls
    `set_batched_rope(True)`): apply_rotary_emb_triton on the arguments of sglang's preset (the rotary slice
    of a token-major copy, [B*S, H, R], and [B*S, R/2] complex rows), the switch on for the call only (the
    module's global, put back after). Its flat kernel reads and writes next_power_of_2(R) channels of every
    row and masks only the rows: when R is not a power of two it runs past the rotary slice into the next
    head's leading channels, which the judge sees. The copy and the table get trailing padding so that the
    overrun of the last row lands in memory of the adapter's, not past an allocation. Forward only."""
    import torch

    module = _sglang_module()

    def rotate(x, cos, sin, rotary):
        b, h, s, d = x.shape
        overrun = (1 << max(rotary - 1, 1).bit_length()) - rotary  # next_power_of_2(R) - R channels
        buffer = torch.zeros(b * s * h * d + overrun, dtype=x.dtype, device=x.device)
        y = buffer[: b * s * h * d].view(b, s, h, d)
        y.copy_(x.detach().transpose(1, 2))
        rows = _complex_rows(cos, sin)
        padded = torch.zeros(rows.shape[0] + 1, rows.shape[1], dtype=rows.dtype, device=rows.device)
        padded[:-1] = rows
        module.set_batched_rope(True)
        try:
            module.apply_rotary_emb_triton(y.view(b * s, h, d)[..., d - rotary :], padded[:-1])
        finally:
            module.set_batched_rope(False)
        return y.transpose(1, 2)

    return [Implementation("sglang:apply_rotary_emb_triton(batched)", PARTIAL_ROPE, rotate, offsets_32bit=True)]


# --- nemo-automodel: common/rope_triton.py and the DeepSeek-V4 eager q path -----------------------------------


def nemo_preset():
    """apply_complex_rope(values [B, S, H, D], frequencies complex64 [B, S, R/2]) rotates the trailing
    2 * (R/2) channels (Triton on CUDA; its own eager path elsewhere, as its public function decides); it
    gets x's [B, S, H, D] view and our tables as cos + i sin. The DeepSeek-V4 q path of
    deepseek_v4/layers.py: _rms_norm_last_dim(q, eps) then _apply_partial_rope(q, cos, sin, R), the two
    functions its attention calls, with our [B, S, R] tables (it reads their first R/2 entries)."""
    _require("nemo-automodel")
    import torch

    rope = importlib.import_module("nemo_automodel.components.models.common.rope_triton")
    layers = importlib.import_module("nemo_automodel.components.models.deepseek_v4.layers")

    def rotate(x, cos, sin, rotary):
        frequencies = torch.complex(_half(cos).float(), _half(sin).float())
        return rope.apply_complex_rope(x.transpose(1, 2), frequencies).transpose(1, 2)

    def qnorm_rotate(x, cos, sin, rotary, eps):
        return layers._apply_partial_rope(layers._rms_norm_last_dim(x, eps), cos, sin, rotary)

    return [
        Implementation(
            "nemo-automodel:apply_complex_rope", PARTIAL_ROPE, rotate,
            backward="their autograd Function on CUDA (their Triton kernel rotating the gradient by the conjugate); "
            "autograd through their eager path elsewhere",
        ),
        Implementation(
            "nemo-automodel:deepseek_v4.q_norm+_apply_partial_rope", QNORM_ROPE, qnorm_rotate,
            backward="autograd through their eager torch ops",
        ),
    ]  # fmt: skip


# --- flash-attn: ops/triton/rotary.py apply_rotary (Triton, in place, leading channels) -------------------------


def _flash_attn_module():
    path = CACHE / release("flash-attn") / "rotary.py"
    if not path.is_file():
        fetch_flash_attn(CACHE)
    if not path.is_file():
        raise Missing(f"{release('flash-attn')}'s rotary.py is not in {CACHE}: `python -m dsrope_gate.presets fetch`")
    return load_module("_dsrope_peer_flash_attn_rotary", path)


def flash_attn_preset():
    """apply_rotary(x [B, S, H, hd], cos, sin [S_ro, R/2], seqlen_offsets, interleaved=True, inplace=True)
    rotates the leading 2 * (R/2) channels of x (hd <= 256), reading row seqlen_offsets[b] + s of its
    batch-less tables: it gets the trailing R channels of a token-major copy of x as its x (hd = R), and
    our tables' pair entries as one [B * S, R/2] table with offsets b * S (one launch; a table shared by
    the batch, stride 0 or B = 1, is passed as [S, R/2] with offset 0). The backward is the same function
    with conjugate=True on the gradient (a Function of the adapter's, their kernel both ways)."""
    import torch

    module = _flash_attn_module()

    def their_tables(cos, sin):
        """(cos, sin, seqlen_offsets) in apply_rotary's convention, from our [B, S, R] tables."""
        c, s = _half(cos), _half(sin)
        if c.shape[0] == 1 or (c.stride(0) == 0 and s.stride(0) == 0):  # one table for the whole batch
            return c[0].contiguous(), s[0].contiguous(), 0
        batch, seq = c.shape[:2]
        offsets = torch.arange(batch, device=c.device, dtype=torch.int32) * seq
        rows = batch * seq  # shapes spelled out: reshape cannot infer -1 from an empty table
        return c.reshape(rows, c.shape[-1]).contiguous(), s.reshape(rows, s.shape[-1]).contiguous(), offsets

    def launch(y, cos, sin, rotary, conjugate):
        c, s, offsets = their_tables(cos, sin)
        module.apply_rotary(
            y[..., y.shape[-1] - rotary :], c, s, seqlen_offsets=offsets, interleaved=True, inplace=True,
            conjugate=conjugate,
        )  # fmt: skip
        return y

    class Rotary(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin, rotary):
            ctx.save_for_backward(cos, sin)
            ctx.rotary = rotary
            return launch(_token_major_copy(x), cos, sin, rotary, False).transpose(1, 2)

        @staticmethod
        def backward(ctx, grad):
            cos, sin = ctx.saved_tensors
            return launch(_token_major_copy(grad), cos, sin, ctx.rotary, True).transpose(1, 2), None, None, None

    def rotate(x, cos, sin, rotary):
        return Rotary.apply(x, cos, sin, rotary)

    def prepare_in_place(x, cos, sin, rotary):
        """Their in-place call on x itself with the tables already in their convention, for the benchmark:
        the returned call is their function alone, as a user holding [S, R/2] tables would call it."""
        c, s, offsets = their_tables(cos, sin)
        rotary_slice = x.transpose(1, 2)[..., x.shape[-1] - rotary :]
        return lambda: module.apply_rotary(rotary_slice, c, s, seqlen_offsets=offsets, interleaved=True, inplace=True)

    return [
        Implementation(
            "flash-attn:apply_rotary", PARTIAL_ROPE, rotate, prepare_in_place=prepare_in_place,
            backward="the adapter's autograd Function: their kernel with conjugate=True on the gradient",
            offsets_32bit=True,
        )
    ]  # fmt: skip


def fetch_flash_attn(cache: Path) -> None:
    """The release's sdist from the package index, and its one Triton module extracted into the cache."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, FLASH_ATTENTION_SKIP_CUDA_BUILD="TRUE")  # its setup.py: metadata without nvcc
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        cmd += ["--no-build-isolation", "-d", tmp, PINS["flash-attn"]]
        if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
            return
        archive = next(Path(tmp).glob(f"flash_attn-{version('flash-attn')}.tar.gz"), None)
        if archive is None:
            return
        with tarfile.open(archive) as tar:
            member = tar.getmember(f"flash_attn-{version('flash-attn')}/flash_attn/ops/triton/rotary.py")
            data = tar.extractfile(member).read()
    target = cache / release("flash-attn") / "rotary.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


# --- megatron-core: fusions/fused_mla_yarn_rope_apply.py (Triton, in place, with backward) ---------------------

MEGATRON_MODULE = "megatron/core/fusions/fused_mla_yarn_rope_apply.py"


def _megatron_module():
    """The one module, from the release's wheel (cp312; this machine runs 3.11), extracted at first use into the
    cache. Its one import from megatron (`null_decorator`, used only where Triton is missing) is given a stand-in
    for the load when megatron itself is not installed: importing megatron.core needs its runtime."""
    path = CACHE / release("megatron-core") / Path(MEGATRON_MODULE).name
    if not path.is_file():
        fetch_megatron(CACHE)
    if not path.is_file():
        fetch_command = "`python -m dsrope_gate.presets fetch`"
        raise Missing(f"{release('megatron-core')}'s {MEGATRON_MODULE} is not in {CACHE}: {fetch_command}")
    import importlib.util

    if importlib.util.find_spec("megatron") is not None:
        return load_module("_dsrope_peer_megatron_mla_rope", path)
    stand_ins = {name: types.ModuleType(name) for name in ("megatron", "megatron.core", "megatron.core.utils")}
    stand_ins["megatron.core.utils"].null_decorator = lambda *args, **kwargs: args[0] if args else (lambda f: f)
    sys.modules.update(stand_ins)
    try:
        return load_module("_dsrope_peer_megatron_mla_rope", path)
    finally:
        for name in stand_ins:
            del sys.modules[name]


def wheel_members(package: str, members, *choice: str) -> dict[str, bytes] | None:
    """The named files (paths in the wheel) of the pinned release's wheel, downloaded from the package index into
    a temporary folder that is not kept; None when pip cannot download it. `choice`: pip's options that pick the
    wheel (a Python version, a platform)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", *choice]
        cmd += ["-d", tmp, PINS[package]]
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            return None
        wheel = next(Path(tmp).glob(f"{package.replace('-', '_')}-{version(package)}-*.whl"), None)
        if wheel is None:
            return None
        with zipfile.ZipFile(wheel) as archive:
            return {name: archive.read(name) for name in members}


def fetch_megatron(cache: Path) -> None:
    """The release's wheel from the package index (for Python 3.12), and its one module extracted into the cache."""
    files = wheel_members("megatron-core", [MEGATRON_MODULE], "--python-version", "3.12")
    if files is None:
        return
    target = cache / release("megatron-core") / Path(MEGATRON_MODULE).name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(files[MEGATRON_MODULE])


def megatron_preset():
    """fused_apply_mla_rope_for_q(t [S, B, H, D], cos, sin [S, 1, 1, R], qk_head_dim=D-R, emb_dim=R) rotates
    the trailing R channels of every head in place (interleaved pairs read, rotary_interleaved=False: their
    only mode), and writes each head's rotated pairs de-interleaved: the R/2 first members, then the R/2
    second ones (Megatron's attention pairs q with a k laid out the same way). Their tables are our pairs'
    entries twice, cat((c, c)) and cat((s, s)), one row per position, and have no batch dim: their kernel
    reads row t // B of token t. The adapter makes one launch: a token-major copy of x as [B*S, 1, H, D]
    (their batch of one), each token b*S + s reading row b*S + s of one [B*S, 1, 1, R] table that holds
    the batch elements' tables one after the other; it interleaves the rotated channels back into ours, a
    permutation, no arithmetic. The backward is theirs (their autograd Function, their backward kernel),
    through that permutation. On CPU their autotuner gets its first config (BLOCK_H = 1 head per program),
    a launch parameter: the interpreter has no benchmarker."""
    import torch

    module = _megatron_module()
    if not module.HAVE_TRITON:  # their module's own switch: below triton 3.4 without CUDA it defines no kernel
        raise Missing("megatron-core's module turns its Triton kernels off here (triton < 3.4 without CUDA)")

    def their_table(t, b, s, rotary):
        half = _half(t)
        return torch.cat((half, half), -1).expand(b, s, rotary).reshape(b * s, 1, 1, rotary).contiguous()

    def rotate(x, cos, sin, rotary):
        if not x.is_cuda:  # the interpreter has no benchmarker for their autotuner: its first config only
            for kernel in (module.rotary_fwd_q_kernel, module.rotary_bwd_q_kernel):
                kernel.configs = kernel.configs[:1]
        b, h, s, d = x.shape
        # a new tensor (their kernel writes into it), keeping x's autograd history
        t = x.transpose(1, 2).clone(memory_format=torch.contiguous_format).view(b * s, 1, h, d)
        t = module.fused_apply_mla_rope_for_q(
            t, their_table(cos, b, s, rotary), their_table(sin, b, s, rotary), d - rotary, rotary
        )
        first, second = t[..., d - rotary : d - rotary // 2], t[..., d - rotary // 2 :]
        rotated = torch.stack((first, second), -1).flatten(-2)
        return torch.cat((t[..., : d - rotary], rotated), -1).view(b, s, h, d).transpose(1, 2)

    return [
        Implementation(
            "megatron-core:fused_apply_mla_rope_for_q", PARTIAL_ROPE, rotate,
            backward="their autograd Function: their Triton backward kernel, through the adapter's permutation",
            offsets_32bit=True,
        )
    ]  # fmt: skip


# --- vLLM: models/deepseek_v4 (Triton q-norm + rope, Triton inverse rope; its rope tables) ---------------------

VLLM = release("vllm")
# The files kept from the release's wheel (CACHE/vllm-<version>/, by their paths in it), in load order: the
# q-norm + rope module, the inverse rope module and the launch machinery it runs through, DeepSeek-V4's rope
# table builder and the rotary-embedding modules it builds from.
VLLM_FILES = (
    "vllm/models/deepseek_v4/xpu/xpu_qnorm_rope_kv_fp8_insert.py",
    "vllm/model_executor/warmup/jit_warmup.py",
    "vllm/model_executor/warmup/jit_warmup_triton_helper.py",
    "vllm/models/deepseek_v4/common/ops/fused_inv_rope_fp8_quant.py",
    "vllm/model_executor/layers/rotary_embedding/common.py",
    "vllm/model_executor/layers/rotary_embedding/base.py",
    "vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py",
    "vllm/models/deepseek_v4/common/rope.py",
)


def fetch_vllm(cache: Path) -> None:
    """The release's wheel from the package index (once; about 340 MB), and the files of VLLM_FILES
    extracted into CACHE/vllm-<version>/ (the wheel is not kept)."""
    files = wheel_members("vllm", VLLM_FILES, "--platform", "manylinux_2_28_x86_64")
    for name, data in (files or {}).items():
        target = cache / VLLM / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


class _VllmPlatform:
    """vLLM's `current_platform` as these files ask it: a CUDA platform where Triton compiles for a CUDA
    device, a CPU one elsewhere (Triton's interpreter included)."""

    @staticmethod
    def is_cuda() -> bool:
        import torch

        return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"

    @classmethod
    def is_cpu(cls) -> bool:
        return not cls.is_cuda()

    @classmethod
    def is_arch_support_pdl(cls) -> bool:
        """vLLM's CUDA platform: programmatic dependent launch on compute capability 9 and up (Hopper)."""
        import torch

        return cls.is_cuda() and torch.cuda.get_device_capability()[0] >= 9

    @property
    def device_type(self) -> str:
        return "cuda" if self.is_cuda() else "cpu"


def _vllm_stand_ins(loaded: dict) -> dict:
    """Stand-ins for the parts of vLLM's runtime that the kept files import (importing vllm itself starts
    its platform, plugins and compiled extensions), none of them in the math judged:

    vllm.triton_utils -> triton and triton.language themselves; vllm.platforms -> _VllmPlatform;
    vllm.envs -> its one read here (warmup threads: 1); vllm.logger -> logging; vllm.utils.flashinfer and
    vllm._aiter_ops -> not installed, not enabled; vllm.model_executor.custom_op.CustomOp -> an nn.Module
    whose custom-op switch is off (it picks forward kernels only; the table is built the same either way);
    vllm.utils.torch_utils.direct_register_custom_op -> as vLLM's: the function registered as a torch op
    in the "vllm" library (for the CPU and CUDA dispatch keys); vllm.utils.deep_gemm -> absent (FP8 scales
    only); vllm.models.deepseek_v4.common.ops.cache_utils -> a quantize_and_insert_k_cache that inserts
    nothing (the FP8 kv-cache insert is outside the op); rotary_embedding.get_rope -> its DeepSeek branch
    (the class and arguments get_rope gives DeepSeek-V4's rope types), the package's other rope classes
    not loaded."""
    import logging

    import torch
    import triton
    import triton.language as tl
    from torch.library import Library, infer_schema

    library = Library("vllm", "FRAGMENT")

    def direct_register_custom_op(op_name, op_func, mutates_args=None, fake_impl=None, target_lib=None, **_):
        lib = target_lib or library
        lib.define(op_name + infer_schema(op_func, mutates_args=mutates_args or []))
        for key in ("CPU", "CUDA"):
            lib.impl(op_name, op_func, dispatch_key=key)
        if fake_impl is not None:
            lib._register_fake(op_name, fake_impl)

    def get_tma_aligned_size(*args, **kwargs):
        raise NotImplementedError("vllm.utils.deep_gemm is not loaded: the FP8 quantisation is outside the op")

    class CustomOp(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

        def enabled(self) -> bool:
            return False

        @classmethod
        def register(cls, name):
            return lambda op: op

    class RocmAiterOps:
        @staticmethod
        def is_triton_rotary_embed_enabled() -> bool:
            return False

    def get_rope(head_size, max_position, is_neox_style=True, rope_parameters=None, dtype=None, **_):
        p = dict(rope_parameters)
        if p["rope_type"] not in ("deepseek_yarn", "deepseek_llama_scaling") or not p.get("is_deepseek_v4"):
            raise NotImplementedError(f"get_rope stand-in: only DeepSeek-V4's rope types, got {p['rope_type']}")
        scaling = loaded["vllm.model_executor.layers.rotary_embedding.deepseek_scaling_rope"]
        extra = {k: p[k] for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim") if k in p}
        return scaling.DeepseekV4ScalingRotaryEmbedding(
            head_size, p["rope_dim"], p["original_max_position_embeddings"], p["rope_theta"], is_neox_style,
            p["factor"], dtype if dtype is not None else torch.get_default_dtype(), **extra,
        )  # fmt: skip

    def module(name, package=False, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        if package:
            m.__path__ = []
        return m

    packages = ["vllm", "vllm.model_executor", "vllm.model_executor.warmup", "vllm.model_executor.layers"]
    packages += ["vllm.models", "vllm.models.deepseek_v4", "vllm.models.deepseek_v4.xpu", "vllm.utils"]
    packages += ["vllm.models.deepseek_v4.common", "vllm.models.deepseek_v4.common.ops"]
    stand_ins = {name: module(name, package=True) for name in packages}
    rotary = "vllm.model_executor.layers.rotary_embedding"
    stand_ins |= {
        "vllm.triton_utils": module("vllm.triton_utils", tl=tl, triton=triton, HAS_TRITON=True),
        "vllm.platforms": module("vllm.platforms", current_platform=_VllmPlatform()),
        "vllm.envs": module("vllm.envs", VLLM_TRITON_JIT_WARMUP_NUM_THREADS=1),
        "vllm.logger": module("vllm.logger", init_logger=logging.getLogger),
        "vllm.utils.flashinfer": module("vllm.utils.flashinfer", has_flashinfer=lambda: False),
        "vllm._aiter_ops": module("vllm._aiter_ops", rocm_aiter_ops=RocmAiterOps()),
        "vllm.model_executor.custom_op": module("vllm.model_executor.custom_op", CustomOp=CustomOp),
        "vllm.utils.torch_utils": module(
            "vllm.utils.torch_utils", direct_register_custom_op=direct_register_custom_op, vllm_lib=library
        ),
        "vllm.utils.deep_gemm": module("vllm.utils.deep_gemm", get_tma_aligned_size=get_tma_aligned_size),
        "vllm.models.deepseek_v4.common.ops.cache_utils": module(
            "vllm.models.deepseek_v4.common.ops.cache_utils", quantize_and_insert_k_cache=lambda *a, **k: None
        ),
        rotary: module(rotary, package=True, get_rope=get_rope),
    }
    return stand_ins


class _VllmImports:
    """vLLM's modules (the stand-ins and the files loaded) in sys.modules while the block runs: their
    functions import some of them at call time. Entered only where no real vllm is imported."""

    def __init__(self, modules: dict):
        self.modules = modules

    def __enter__(self):
        if sys.modules.get("vllm", self.modules["vllm"]) is not self.modules["vllm"]:
            raise RuntimeError("vllm was imported in this process after its preset loaded: stand-ins would shadow it")
        sys.modules.update(self.modules)

    def __exit__(self, *exc):
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]


_VLLM_LOADED: dict = {}


def _vllm_modules() -> dict:
    """The kept files of the pinned vLLM loaded under their own module names (so that their imports of each
    other resolve), with _vllm_stand_ins for the rest of vLLM; once per process (their torch ops are
    registered once). The files come from CACHE/vllm-<version>/, fetched at first use."""
    if _VLLM_LOADED:
        return _VLLM_LOADED
    if "vllm" in sys.modules:
        raise Missing("vllm is imported in this process: its kept files load beside stand-ins in a process without it")
    root = CACHE / VLLM
    if not all((root / name).is_file() for name in VLLM_FILES):
        fetch_vllm(CACHE)
    if not all((root / name).is_file() for name in VLLM_FILES):
        raise Missing(f"{VLLM}'s DeepSeek-V4 modules are not in {root}: `python -m dsrope_gate.presets fetch`")
    modules: dict = {}
    modules |= _vllm_stand_ins(modules)
    with _VllmImports(modules):
        for name in VLLM_FILES:
            dotted = name.removesuffix(".py").replace("/", ".")
            modules[dotted] = load_module(dotted, root / name)
    _VLLM_LOADED.update(modules)
    return _VLLM_LOADED


def _cos_sin_cache(cos, sin):
    """Our tables as vLLM's FP32 cos_sin_cache, one row per token (b, s): [B*S, R], row t = the R/2 cos
    of token t's pairs, then their R/2 sin."""
    import torch

    rotary = cos.shape[-1]
    rows = cos.shape[0] * cos.shape[1]
    return torch.cat((_half(cos), _half(sin)), -1).float().reshape(rows, rotary).contiguous()


def vllm_preset():
    """Two Triton kernels of vLLM's DeepSeek-V4, loaded from the release's wheel (_vllm_modules: the
    q-norm module's import of vllm.triton_utils for tl and triton is given triton itself; its call-time
    import of the FP8 kv-cache insert and the inverse rope's imports of vLLM's runtime get the stand-ins
    _vllm_stand_ins lists), each called through its own launch function on a token-major copy of x as
    their [T, H, D] (T = B*S tokens), with our tables as their cos_sin_cache (_cos_sin_cache: token t
    reads row t, positions = arange(T)):

    xpu_qnorm_rope_kv_fp8_insert(q, kv, swa_kv_cache, slot_mapping, positions, cos_sin_cache, eps,
    block_size) normalizes each head of q in place (no weight) and rotates its last 64 channels as
    interleaved (GPT-J) pairs; its kernel's shape is the module's constants, head_dim 512 and rope_dim 64:
    other D or R are refused before launch. Its one launch also runs one program per token that rotates
    kv into a buffer of its own for the FP8 kv-cache insert: it gets zeros as kv (a [T, 512] tensor of
    x's dtype, read by those programs only), a [1, 0] uint8 swa_kv_cache, slot_mapping = positions and
    block_size 1, and the insert that follows is a stand-in that inserts nothing (_vllm_stand_ins). No
    program of the kv part reads or writes q, so q's bits are the q part's alone.

    fused_inv_rope_fp8_quant(o, positions, cos_sin_cache, n_groups=1, heads_per_group=H, nope_dim=D-R,
    rope_dim=R, quant_group_size=128, quantize=False) is the inverse rope on the attention output, the
    path vLLM runs when wo_a is not FP8 (its o_proj: quantize=use_fp8): no FP8 quantisation, the rotated
    heads stored in x's dtype, [T, 1, H*D]. It rotates each pair (a, b) of the trailing R channels by the
    conjugate of the cache's angle, (a*c + b*s, b*c - a*s); given our sin negated it is the contract's
    rotation (a*c - b*s, a*s + b*c), each product and sum the same FP32 operation (negation is exact).
    Its kernel loads whole heads (tl.arange over D): D a power of two and a multiple of 128, else refused
    before launch. On a GPU of compute capability 9 or more its kernel takes its launch_pdl path
    (programmatic dependent launch's waits), as vLLM's CUDA platform decides there (the interpreter:
    without, as vLLM's CPU platform).

    Both are forward only (the results carry no grad_fn)."""
    import torch

    modules = _vllm_modules()
    qnorm = modules["vllm.models.deepseek_v4.xpu.xpu_qnorm_rope_kv_fp8_insert"]
    inverse = modules["vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant"]

    def qnorm_rotate(x, cos, sin, rotary, eps):
        b, h, s, d = x.shape
        if (d, rotary) != (qnorm.HEAD_DIM, qnorm.ROPE_DIM):
            raise ValueError(
                f"x, rotary: their kernel is built for head_dim {qnorm.HEAD_DIM} and rope_dim {qnorm.ROPE_DIM} "
                f"(module constants), got D={d}, R={rotary}"
            )
        q = _token_major_copy(x).view(b * s, h, d)
        positions = torch.arange(b * s, device=x.device)
        kv = torch.zeros(b * s, d, dtype=x.dtype, device=x.device)
        swa_kv_cache = torch.empty(1, 0, dtype=torch.uint8, device=x.device)
        cache = _cos_sin_cache(cos, sin)
        with _VllmImports(modules):
            qnorm.xpu_qnorm_rope_kv_fp8_insert(q, kv, swa_kv_cache, positions, positions, cache, eps, 1)
        return q.view(b, s, h, d).transpose(1, 2)

    def rotate(x, cos, sin, rotary):
        b, h, s, d = x.shape
        if d & (d - 1) or d % 128:
            raise ValueError(f"x: their kernel loads whole heads, D a power of two and a multiple of 128, got D={d}")
        o = _token_major_copy(x).view(b * s, h, d)
        positions = torch.arange(b * s, device=x.device)
        with _VllmImports(modules):
            out, _ = inverse.fused_inv_rope_fp8_quant(
                o, positions, _cos_sin_cache(cos, -sin), n_groups=1, heads_per_group=h, nope_dim=d - rotary,
                rope_dim=rotary, quant_group_size=128, quantize=False,
            )  # fmt: skip
        return out.reshape(b, s, h, d).transpose(1, 2)

    return [
        Implementation("vllm:xpu_qnorm_rope_kv_fp8_insert", QNORM_ROPE, qnorm_rotate, offsets_32bit=True),
        Implementation("vllm:fused_inv_rope_fp8_quant(quantize=False,-sin)", PARTIAL_ROPE, rotate),
    ]


# --- the registry --------------------------------------------------------------------------------------------

PRESETS = {
    "dsrope": dsrope_preset,
    "eager-chain": eager_chain_preset,
    "transformers": transformers_preset,
    "veomni": veomni_preset,
    "sglang": sglang_preset,
    "sglang-batched": sglang_batched_preset,
    "nemo-automodel": nemo_preset,
    "flash-attn": flash_attn_preset,
    "megatron-core": megatron_preset,
    "vllm": vllm_preset,
}


def _each_preset(registry: dict, names, progress) -> list:
    """What registry[preset] gives for each of `names` ('all': every preset of the registry): `NAME` (its
    pinned release) or `NAME@VERSION` (one of releases(NAME)), the entries of a named version renamed
    `NAME@VERSION:...`. A preset that cannot load is skipped with its reason; a release that conflicts
    with one already imported in this process raises VersionConflict."""
    chosen = list(registry) if "all" in names else list(dict.fromkeys(names))
    unknown = [n for n in chosen if n.partition("@")[0] not in registry]
    if unknown:
        raise ValueError(f"--preset: unknown {unknown}; known: {', '.join(registry)} (NAME or NAME@VERSION) or all")
    for spec in chosen:
        preset, _, at = spec.partition("@")
        if at and at not in releases(preset):
            pinned = ", ".join(f"{preset}@{v}" for v in releases(preset)) or f"{preset} (no pinned release)"
            raise ValueError(f"--preset {spec}: not a pinned release; pinned: {pinned}")
    found = []
    for spec in chosen:
        preset, _, at = spec.partition("@")
        beside = at and at != releases(preset)[0]  # a release pinned beside the installed one
        try:
            if len(releases(preset)) > 1:
                use_release(preset, at or None)
            entries = registry[preset](at) if beside else registry[preset]()
        except VersionConflict:
            raise
        except Missing as e:
            progress(f"preset {spec} skipped: {e}")
            continue
        except Exception as e:  # a peer release that no longer imports: say so, judge the others
            progress(f"preset {spec} skipped: it does not load ({type(e).__name__}: {e})")
            continue
        if at:
            entries = [replace(e, name=e.name.replace(f"{preset}:", f"{spec}:", 1)) for e in entries]
        found += entries
    return found


def load(names, device: str, ops=None, progress=print) -> list[Implementation]:
    """The implementations of each named preset (`NAME`, `NAME@VERSION` or 'all': every NAME) for `ops`
    (op names; None: every op); a preset that cannot load is skipped with its reason. A release pinned
    beside the installed one (transformers@5.23.0) is put first on sys.path before its package is
    imported; in a process that has imported another release of that package, VersionConflict. Presets
    loaded after it in the same process that import its package get that release too: a release pinned
    beside the installed one is loaded alone, in a process of its own."""
    return [impl for impl in _each_preset(PRESETS, names, progress) if ops is None or impl.op.name in ops]


def fetch(folder: Path) -> None:
    """The pinned releases as files for an offline GPU host: the wheels of veomni and nemo-automodel, the
    one sglang module, flash-attn's rotary.py, megatron-core's fused_mla_yarn_rope_apply.py, vLLM's kept
    files (vllm-<version>/) and the wheel of each release pinned beside the installed one in its own folder
    (transformers-5.23.0/: installed into that folder at first use; not among the top-level wheels, which
    a host installs together; the pinned transformers is not fetched: the GPU hosts have it installed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("veomni", "nemo-automodel"):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder), PINS[name]])
    for key in [k for k in PINS if "@" in k]:
        package, _, at = key.partition("@")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
        subprocess.run(cmd + ["-d", str(folder / f"{package}-{at}"), PINS[key]])
    sglang = folder / release("sglang") / SGLANG_MODULE
    sglang.parent.mkdir(parents=True, exist_ok=True)
    sglang.write_bytes(Path(_sglang_module().__file__).read_bytes())
    fetch_flash_attn(folder)
    fetch_megatron(folder)
    fetch_vllm(folder)
    print(f"wrote {folder}: {sorted(p.name for p in folder.iterdir())}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["fetch"]:
        fetch(Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".whl/peers"))
    else:
        print(__doc__)
