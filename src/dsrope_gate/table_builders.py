"""Table builders of the pinned projects and dsrope's own, each behind the rope_tables signature
`fn(positions, rotary, theta, rope_scaling) -> (cos, sin)` (dsrope_gate.tables), for the tables' judge.

Every adapter calls the real code of the pinned release (presets.PINS; never a copy of it) and maps our
convention onto theirs: positions int64 [B, S] on the device the table is built on; rope_scaling None (plain)
or the DeepSeek config dict, YaRN applied whenever it is given; cos, sin FP32 [B, S, R] whose first R/2
entries are pair k's. Their tables come half-width ([B, S, R/2]: the adapter writes pair k's value into
entries k and k + R/2), duplicated ([.., cat(f, f)]: as they are), complex (real and imaginary parts) or one
row per position 0 .. P-1 (rows gathered at the positions). An attention factor folded into cos and sin is
declared by the adapter as their code computes it. Where their model builds the table in the activations'
dtype, a "(bf16 activations)" builder calls it as their model does with bf16 activations (the cast to FP32
after is exact). A builder that cannot take a case raises NotImplementedError naming why.

    BUILDERS[name]() -> [TableBuilder, ...]; load(names) skips a project whose pinned package is missing
    (names as presets.load takes them: NAME, NAME@VERSION or all).
    python -m tools.table_verdicts [--device cuda] [--tf32] [--slow] [--builders all|dsrope,sglang,...]
    python -m dsrope_gate.table_builders fetch [DIR]   # megatron-core's embedding modules into DIR (default
                                                       # .whl/peers), for an offline host (DSROPE_PEERS_CACHE=DIR)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

import torch

from dsrope_gate import tables
from dsrope_gate.pins import PINS, release
from dsrope_gate.presets import (
    CACHE,
    Missing,
    _each_preset,
    _require,
    _sglang_module,
    _vllm_modules,
    _VllmImports,
    wheel_members,
)
from dsrope_gate.tables import TableBuilder
from dsrope_gate.targets import load_module

# DeepSeek-V4's max_position_embeddings (transformers' DeepseekV4Config default, the released checkpoints' value),
# in the config vLLM's builder is given: its main layers take their YaRN correction range (factor 1) from it and,
# times the factor, the rows of every cache it builds.
DEEPSEEK_V4_MAX_POSITIONS = 1048576


def _duplicated(half: torch.Tensor) -> torch.Tensor:
    """[.., R/2] -> [.., R]: pair k's value in entries k and k + R/2."""
    return torch.cat((half, half), -1)


def _from_complex(table: torch.Tensor):
    return _duplicated(table.real.float()), _duplicated(table.imag.float())


def _rows(positions: torch.Tensor) -> int:
    """The rows of a table indexed by position that reaches every position given."""
    return int(positions.max()) + 1 if positions.numel() else 1


def _span(positions: torch.Tensor) -> tuple[int, int]:
    """(the smallest position, the rows from it through the largest)."""
    if not positions.numel():
        return 0, 1
    first = int(positions.min())
    return first, int(positions.max()) - first + 1


def _yarn_length(positions: torch.Tensor, rope_scaling) -> int:
    """A max_seq_len past the original length when rope_scaling is given (their YaRN applies only there; the
    op applies it whenever rope_scaling is given) and past every position."""
    original = rope_scaling["original_max_position_embeddings"] if rope_scaling else 0
    return max(_rows(positions), original + 1)


def _yarn_keys(rope_scaling) -> dict:
    """The config dict without its "type" (transformers' rope_parameters name it rope_type)."""
    return {k: v for k, v in rope_scaling.items() if k != "type"}


def _yarn_max(rope_scaling) -> int:
    """transformers' max_position_embeddings for a config: factor times the original length (their YaRN uses
    the explicit factor either way and warns where the two disagree)."""
    if rope_scaling is None:
        return 1 << 20
    return int(rope_scaling["factor"] * rope_scaling["original_max_position_embeddings"])


def v4_config(rotary: int, theta: float, rope_scaling):
    """transformers' DeepseekV4Config for a table: plain tables its "main" rope (rope_theta = theta), YaRN ones its
    "compress" rope (compress_rope_theta = theta, rope_parameters from our dict); head_dim 512 and
    partial_rotary_factor R/512 give R."""
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    yarn = rope_scaling is not None
    return DeepseekV4Config(
        num_hidden_layers=2, head_dim=512, partial_rotary_factor=rotary / 512,
        max_position_embeddings=_yarn_max(rope_scaling),
        rope_theta=10000.0 if yarn else theta, compress_rope_theta=theta if yarn else 160000.0,
        rope_parameters=dict(rope_type="yarn", **_yarn_keys(rope_scaling)) if yarn else None,
    )  # fmt: skip


# --- dsrope: rope_utils (the trained table, and fp64=True) -------------------------------------------------


def dsrope_tables(positions, rotary, theta, rope_scaling, fp64=False):
    """precompute_freqs_cis(R, max_seq_len, theta, rope_scaling, fp64) then freqs_cis_from_position_ids(positions,
    freqs, fp64): complex64 [B, S, R/2] at the positions given. max_seq_len is taken past the original length so
    that their YaRN condition holds whenever rope_scaling is given. No attention factor. (dsrope's own
    implementation of the op: dsrope_gate.ops.ROPE_TABLES.dsrope.)"""
    from dsrope.rope_utils import freqs_cis_from_position_ids, precompute_freqs_cis

    freqs = precompute_freqs_cis(rotary, _yarn_length(positions, rope_scaling), theta, rope_scaling, fp64=fp64)
    return _from_complex(freqs_cis_from_position_ids(positions, freqs, fp64=fp64))


def dsrope_builders():
    """dsrope_tables, in FP32 (the trained table) and with fp64=True."""
    return [
        TableBuilder("dsrope:freqs_cis_from_position_ids", dsrope_tables),
        TableBuilder("dsrope:freqs_cis_from_position_ids(fp64=True)", functools.partial(dsrope_tables, fp64=True)),
    ]


# --- transformers 5.17.0: DeepseekV4RotaryEmbedding, DeepseekV3RotaryEmbedding ---------------------------------


def transformers_builders(at: str | None = None):
    """DeepseekV4RotaryEmbedding(config)(x, position_ids, layer_type) -> cos, sin [B, S, R/2] (half-width, in x's
    dtype): plain tables are its "main" layer type (rope_theta = theta), YaRN ones its "compress" type
    (compress_rope_theta = theta, rope_parameters from our dict); head_dim 512 and partial_rotary_factor R/512 give
    R. Its config forces attention_factor 1.0 on the compress type (declared 1.0). DeepseekV3RotaryEmbedding
    (qk_rope_head_dim R, rope_parameters rope_type "yarn" or "default") -> [B, S, R] duplicated, times its
    attention_scaling (declared: their value for the dict, from their ROPE_INIT_FUNCTIONS). `at`: a release
    pinned beside the installed one (`transformers@VERSION`), made importable first (presets.use_release, which
    load does before it calls this)."""
    _require("transformers", at)
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

    def v4_tables(dtype):
        def fn(positions, rotary, theta, rope_scaling):
            yarn = rope_scaling is not None
            embedding = v4.DeepseekV4RotaryEmbedding(v4_config(rotary, theta, rope_scaling)).to(positions.device)
            x = torch.zeros(1, dtype=dtype, device=positions.device)
            cos, sin = embedding(x, positions, layer_type="compress" if yarn else "main")
            return _duplicated(cos.float()), _duplicated(sin.float())

        return fn

    def v3_embedding(rotary, theta, rope_scaling):
        rope = dict(rope_type="yarn", rope_theta=theta, **_yarn_keys(rope_scaling)) if rope_scaling else None
        rope = rope or dict(rope_type="default", rope_theta=theta)
        config = DeepseekV3Config(
            qk_rope_head_dim=rotary, rope_parameters=rope, max_position_embeddings=_yarn_max(rope_scaling)
        )
        return DeepseekV3RotaryEmbedding(config)

    def v3_tables(positions, rotary, theta, rope_scaling):
        embedding = v3_embedding(rotary, theta, rope_scaling).to(positions.device)
        cos, sin = embedding(torch.zeros(1, device=positions.device), positions)
        return cos.float(), sin.float()

    def v3_factor(rope_scaling):
        return float(v3_embedding(64, 10000.0, rope_scaling).attention_scaling)

    return [
        TableBuilder("transformers:DeepseekV4RotaryEmbedding", v4_tables(torch.float32)),
        TableBuilder("transformers:DeepseekV4RotaryEmbedding(bf16 activations)", v4_tables(torch.bfloat16)),
        TableBuilder("transformers:DeepseekV3RotaryEmbedding", v3_tables, v3_factor),
    ]


# --- sglang 0.5.23: kernels/ops/attention/dsv4/rope.py precompute_freqs_cis ----------------------------------


def sglang_builders():
    """precompute_freqs_cis(dim, seqlen, original_seq_len, base, factor, beta_fast, beta_slow) -> complex64
    [seqlen, R/2], one row per position 0 .. seqlen-1 (what its DeepSeek-V4 attention registers as freqs_cis
    and indexes by position): seqlen reaches the largest position, rows gathered at the positions. Its YaRN
    switch is original_seq_len > 0: the dict's original length when given, 0 for a plain table (as its model
    passes for layers without compression). No attention factor. Loaded as sglang's preset loads the module."""
    module = _sglang_module()

    def fn(positions, rotary, theta, rope_scaling):
        s = rope_scaling or {}
        table = module.precompute_freqs_cis(
            rotary, _rows(positions), s.get("original_max_position_embeddings", 0), theta, s.get("factor", 1.0),
            s.get("beta_fast", 32), s.get("beta_slow", 1),
        )  # fmt: skip
        return _from_complex(table.to(positions.device)[positions])

    return [TableBuilder("sglang:precompute_freqs_cis", fn)]


# --- nemo-automodel 0.7.0: deepseek_v4 DeepseekV4RotaryEmbedding, deepseek_v3 rope_utils ------------------------


def nemo_builders():
    """deepseek_v4/layers.py DeepseekV4RotaryEmbedding(rope_theta, head_dim=R, partial_rotary_factor=1.0,
    rope_scaling)(x, position_ids) -> cos, sin [B, S, R] duplicated, in x's dtype (their model passes its
    hidden states); their YaRN switch is rope_scaling["type"] == "yarn", which our dict carries. Attention
    factor: their default 1.0, as their model builds it. deepseek_v3/rope_utils.py precompute_freqs_cis(R,
    max_seq_len, theta, rope_scaling) then freqs_cis_from_position_ids(positions, freqs): complex64 [B, S, R/2]
    (max_seq_len past the original length, so that their YaRN condition holds)."""
    _require("nemo-automodel")
    layers = importlib.import_module("nemo_automodel.components.models.deepseek_v4.layers")
    v3 = importlib.import_module("nemo_automodel.components.models.deepseek_v3.rope_utils")

    def v4_tables(dtype):
        def fn(positions, rotary, theta, rope_scaling):
            embedding = layers.DeepseekV4RotaryEmbedding(theta, rotary, 1.0, rope_scaling=rope_scaling)
            x = torch.zeros(1, dtype=dtype, device=positions.device)
            cos, sin = embedding.to(positions.device)(x, positions)
            return cos.float(), sin.float()

        return fn

    def v3_tables(positions, rotary, theta, rope_scaling):
        freqs = v3.precompute_freqs_cis(rotary, _yarn_length(positions, rope_scaling), theta, rope_scaling)
        return _from_complex(v3.freqs_cis_from_position_ids(positions, freqs))

    return [
        TableBuilder("nemo-automodel:deepseek_v4.DeepseekV4RotaryEmbedding", v4_tables(torch.float32)),
        TableBuilder(
            "nemo-automodel:deepseek_v4.DeepseekV4RotaryEmbedding(bf16 activations)", v4_tables(torch.bfloat16)
        ),
        TableBuilder("nemo-automodel:deepseek_v3.freqs_cis_from_position_ids", v3_tables),
    ]


# --- megatron-core 0.19.2: models/common/embeddings (YarnRotaryEmbedding, RotaryEmbedding) --------------------

MEGATRON_EMBEDDINGS = "megatron/core/models/common/embeddings"
MEGATRON_FILES = ("rope_utils.py", "rotary_pos_embedding.py", "yarn_rotary_pos_embedding.py")


def fetch_megatron_embeddings(cache: Path) -> None:
    """The release's wheel (for Python 3.12) from the package index, its three embedding modules into the cache."""
    files = wheel_members(
        "megatron-core", [f"{MEGATRON_EMBEDDINGS}/{n}" for n in MEGATRON_FILES], "--python-version", "3.12"
    )
    if files is None:
        return
    folder = cache / release("megatron-core") / "embeddings"
    folder.mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        (folder / Path(path).name).write_bytes(data)


@functools.cache
def _megatron_embeddings():
    """Their rotary_pos_embedding and yarn_rotary_pos_embedding modules: imported where megatron-core is
    installed; else, with rope_utils, from the release's wheel (cp312), loaded under their own names with
    stand-ins for the megatron runtime they import at module level and never reach on this path: parallel_state
    (get_context_parallel_group: no context parallelism), utils (internal_api and deprecate_inference_params:
    decorators) and transformer (TransformerConfig: a type). Stand-ins and modules leave sys.modules after."""
    package = MEGATRON_EMBEDDINGS.replace("/", ".")
    if importlib.util.find_spec("megatron") is not None:
        _require("megatron-core")
        return tuple(importlib.import_module(f"{package}.{n[:-3]}") for n in MEGATRON_FILES[1:])
    folder = CACHE / release("megatron-core") / "embeddings"
    if not all((folder / name).is_file() for name in MEGATRON_FILES):
        fetch_megatron_embeddings(CACHE)
    if not all((folder / name).is_file() for name in MEGATRON_FILES):
        raise Missing(f"{PINS['megatron-core']}'s {MEGATRON_EMBEDDINGS} is not in {CACHE}: pip cannot download it")
    names = ["megatron", "megatron.core", "megatron.core.models", "megatron.core.models.common", package]
    stand_ins = {name: types.ModuleType(name) for name in names}
    for name in names:
        stand_ins[name].__path__ = []
    stand_ins["megatron.core.parallel_state"] = state = types.ModuleType("megatron.core.parallel_state")
    state.get_context_parallel_group = lambda check_initialized=True: None
    stand_ins["megatron.core"].parallel_state = state
    stand_ins["megatron.core.utils"] = utils = types.ModuleType("megatron.core.utils")
    utils.internal_api = utils.deprecate_inference_params = lambda f: f
    stand_ins["megatron.core.transformer"] = transformer = types.ModuleType("megatron.core.transformer")
    transformer.TransformerConfig = type("TransformerConfig", (), {})
    loaded = {}
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        for name in MEGATRON_FILES:
            module = f"{package}.{name[:-3]}"
            loaded[name] = sys.modules[module] = load_module(module, folder / name)
    finally:
        for name in [*stand_ins, *(f"{package}.{n[:-3]}" for n in MEGATRON_FILES)]:
            sys.modules.pop(name, None)
        sys.modules.update({k: v for k, v in saved.items() if v is not None})
    return loaded["rotary_pos_embedding.py"], loaded["yarn_rotary_pos_embedding.py"]


@contextlib.contextmanager
def _their_device(device: torch.device):
    """On the CPU, their `torch.cuda.current_device()` (where their code moves the frequencies) names the CPU."""
    if device.type == "cuda":
        yield
        return
    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = saved


def megatron_builders():
    """YarnRotaryEmbedding(R, rotary_base=theta, scaling_factor, original_max_position_embeddings, beta_fast,
    beta_slow, mscale, mscale_all_dim).get_cached_cos_sin(seq_len, dtype) -> cos, sin [seq_len, 1, 1, R]
    duplicated, one row per position, times their concentration factor (their cache, as their multi-latent
    attention takes it: in the activations' dtype). Absent mscale keys take their defaults (1.0 and 0.0), so
    their factor for DeepSeek-V4's compress layers is 1.2773 (declared, from their
    _yarn_get_concentration_factor). RotaryEmbedding(R, 1.0, rotary_base=theta).get_cos_sin(seq_len) -> cos,
    sin [seq_len, R/2] (their plain rope). Their rows are positions offset .. offset + seq_len - 1 (arange(seq_len)
    + offset in FP32): offset the smallest position, seq_len reaching the largest, rows gathered at the positions.
    Each refuses the other's cases. On the CPU, use_cpu_initialization and their device query naming the CPU."""
    rotary_module, yarn_module = _megatron_embeddings()

    def their_args(rope_scaling):
        s = rope_scaling
        return dict(
            scaling_factor=s["factor"], original_max_position_embeddings=s["original_max_position_embeddings"],
            beta_fast=s["beta_fast"], beta_slow=s["beta_slow"], mscale=s.get("mscale", 1.0),
            mscale_all_dim=s.get("mscale_all_dim", 0.0),
        )  # fmt: skip

    def yarn_tables(dtype):
        def fn(positions, rotary, theta, rope_scaling):
            if rope_scaling is None:
                raise NotImplementedError("megatron-core's YarnRotaryEmbedding builds YaRN tables only")
            first, rows = _span(positions)
            with _their_device(positions.device):
                embedding = yarn_module.YarnRotaryEmbedding(
                    rotary, rotary_base=theta, use_cpu_initialization=True, **their_args(rope_scaling)
                )
                cos, sin = embedding.get_cached_cos_sin(rows, offset=first, dtype=dtype)
            return tuple(t.to(positions.device)[positions - first][:, :, 0, 0].float() for t in (cos, sin))

        return fn

    def yarn_factor(rope_scaling):
        if rope_scaling is None:
            return 1.0
        a = their_args(rope_scaling)
        return float(yarn_module._yarn_get_concentration_factor(a["scaling_factor"], a["mscale"], a["mscale_all_dim"]))

    def plain_tables(positions, rotary, theta, rope_scaling):
        if rope_scaling is not None:
            raise NotImplementedError(
                "megatron-core's RotaryEmbedding builds plain tables; YaRN is YarnRotaryEmbedding"
            )
        first, rows = _span(positions)
        with _their_device(positions.device):
            embedding = rotary_module.RotaryEmbedding(rotary, 1.0, rotary_base=theta, use_cpu_initialization=True)
            embedding.inv_freq = embedding.inv_freq.to(positions.device)
            cos, sin = embedding.get_cos_sin(rows, offset=first)
        return _duplicated(cos[positions - first]), _duplicated(sin[positions - first])

    return [
        TableBuilder("megatron-core:YarnRotaryEmbedding", yarn_tables(torch.float32), yarn_factor),
        TableBuilder("megatron-core:YarnRotaryEmbedding(bf16 activations)", yarn_tables(torch.bfloat16), yarn_factor),
        TableBuilder("megatron-core:RotaryEmbedding", plain_tables),
    ]


# --- veomni 0.1.12: models/transformers/deepseek_v4 (its patched DeepseekV4RotaryEmbedding) ---------------------


def _veomni_modeling():
    """Their patched DeepSeek-V4 modeling module. Importing it imports veomni.utils.helper, which imports psutil
    (a dependency of veomni's used there for memory reports only): where psutil is missing, a stand-in module
    serves the import and leaves sys.modules after it."""
    name = "veomni.models.transformers.deepseek_v4.generated.patched_modeling_deepseek_v4_gpu"
    if importlib.util.find_spec("psutil") is not None:
        return importlib.import_module(name)
    stand_in = types.ModuleType("psutil")
    stand_in.__spec__ = importlib.machinery.ModuleSpec("psutil", None)
    sys.modules["psutil"] = stand_in
    try:
        return importlib.import_module(name)
    finally:
        del sys.modules["psutil"]


def veomni_builders():
    """Their patched DeepseekV4RotaryEmbedding (transformers' DeepseekV4Config, the same mapping as the
    transformers builder): cos, sin [B, S, R/2] half-width; in training mode (a module's default) in x's dtype,
    FP32 here. Attention factor 1.0 (the config's, on the compress type)."""
    _require("veomni")
    modeling = _veomni_modeling()

    def fn(positions, rotary, theta, rope_scaling):
        yarn = rope_scaling is not None
        embedding = modeling.DeepseekV4RotaryEmbedding(v4_config(rotary, theta, rope_scaling)).to(positions.device)
        x = torch.zeros(1, device=positions.device)
        cos, sin = embedding(x, positions, layer_type="compress" if yarn else "main")
        return _duplicated(cos.float()), _duplicated(sin.float())

    return [TableBuilder("veomni:DeepseekV4RotaryEmbedding", fn)]


# --- vLLM 0.33.0: models/deepseek_v4/common/rope.py build_deepseek_v4_rope's cos_sin_cache ------------------------


def vllm_builders():
    """build_deepseek_v4_rope(config, head_dim, rope_head_dim=R, max_position_embeddings, compress_ratio) gives a
    DeepseekV4ScalingRotaryEmbedding whose cos_sin_cache (FP32 [rows, R]: the R/2 cos of a position's pairs, then
    their R/2 sin) the q path reads at each token's position: rows gathered at the positions, each half
    duplicated. The config it reads is ours: a plain table is a main (sliding-window) layer, compress_ratio 1,
    rope_theta = theta; with rope_scaling a compress layer, compress_ratio 4, compress_rope_theta = theta,
    rope_parameters = {"rope_type": "yarn", **rope_scaling}; max_position_embeddings is DeepSeek-V4's, 2**20.
    Their mapping then applies: YaRN on compress layers only, a factor-1 YaRN ("deepseek_yarn", original length
    2**20, beta_fast and beta_slow at their defaults 32 and 1) on main layers, mscale and mscale_all_dim forced to
    0 (no attention factor: 1.0 whatever rope_scaling says). The cache is built on the positions' device, as vLLM
    builds its model under its target device, over all its rows (2**20 * factor; positions past them are
    refused); the last one built is kept for the next call. Loaded as vLLM's preset loads its files
    (presets._vllm_modules: the release's files beside stand-ins for its runtime)."""
    modules = _vllm_modules()
    build = modules["vllm.models.deepseek_v4.common.rope"].build_deepseek_v4_rope
    built: dict = {}

    def fn(positions, rotary, theta, rope_scaling):
        key = (rotary, float(theta), tuple(sorted((rope_scaling or {}).items())), str(positions.device))
        if key not in built:
            built.clear()  # one cache of 2**20 rows at a time
            config = types.SimpleNamespace(
                rope_theta=theta, compress_rope_theta=theta,
                rope_parameters={"rope_type": "yarn", **rope_scaling} if rope_scaling else {"rope_type": "default"},
            )  # fmt: skip
            with torch.device(positions.device), _VllmImports(modules):
                embedding = build(
                    config, head_dim=max(512, rotary), rope_head_dim=rotary,
                    max_position_embeddings=DEEPSEEK_V4_MAX_POSITIONS, compress_ratio=4 if rope_scaling else 1,
                )  # fmt: skip
            built[key] = embedding.cos_sin_cache
        cache = built[key]
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= cache.shape[0]):
            raise NotImplementedError(f"positions: their cache holds positions 0 to {cache.shape[0] - 1}")
        rows = cache[positions]
        return _duplicated(rows[..., : rotary // 2]), _duplicated(rows[..., rotary // 2 :])

    return [TableBuilder("vllm:DeepseekV4ScalingRotaryEmbedding.cos_sin_cache", fn)]


# --- the registry ---------------------------------------------------------------------------------------------

# Each project's builders under its preset's name (dsrope_gate.presets.PRESETS), so that one name gives both its
# implementations and its tables (the conformance command's --preset with --op rope_tables; its --pipeline).
BUILDERS = {
    "dsrope": dsrope_builders,
    "transformers": transformers_builders,
    "sglang": sglang_builders,
    "nemo-automodel": nemo_builders,
    "megatron-core": megatron_builders,
    "veomni": veomni_builders,
    "vllm": vllm_builders,
}


def load(names, progress=print) -> list[TableBuilder]:
    """The builders of each named project, `NAME`, `NAME@VERSION` (a release pinned beside the installed one,
    its builders named `NAME@VERSION:...`) or 'all', as presets.load takes them; a project that cannot load is
    skipped with its reason, and a release whose package another release of holds this process raises
    presets.VersionConflict (load it in a process of its own)."""
    return _each_preset(BUILDERS, names, progress)


def main(argv=None) -> int:
    """The builders' verdicts and semantics on one device, as markdown (tools/table_verdicts.py); or `fetch [DIR]`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["fetch"]:
        folder = Path(argv[1]) if len(argv) > 1 else Path(".whl/peers")
        fetch_megatron_embeddings(folder)
        written = folder.glob(f"{release('megatron-core')}/embeddings/*")
        print(f"wrote {sorted(str(p.relative_to(folder)) for p in written)}")
        return 0
    import argparse

    p = argparse.ArgumentParser(description="the table builders' verdicts and semantics (dsrope_gate.tables)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tf32", action="store_true", help="CUDA matmuls in TF32 (torch.backends.cuda.matmul.allow_tf32)")
    p.add_argument("--slow", action="store_true", help="tables.SLOW_CASES (8 times the positions)")
    p.add_argument("--builders", default="all", help="comma-separated projects of BUILDERS, or all")
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    device = torch.device(args.device)
    cases = tables.SLOW_CASES if args.slow else tables.CASES
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {device} ({name}), torch {torch.__version__}, TF32 matmuls {'on' if args.tf32 else 'off'}")
    found = load(args.builders.split(","), progress=lambda m: print(m, file=sys.stderr))
    print(tables.render({b.name: tables.judge(b, cases, device) for b in found}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
