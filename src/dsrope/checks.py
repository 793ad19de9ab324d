"""Every argument check of dsrope (the one place they live), and what a call's arguments ask of it.

Every check runs before any launch and raises a TypeError or ValueError that names the argument and
what was expected. `kernels_run_on` says whether the Triton kernels run on a device; `wants_autograd`
whether a call must go through an autograd.Function.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from dsrope.interpreter import INTERPRET

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
QKV_FORMATS = ("bshd", "thd")  # rope_utils: [batch, sequence, heads, channels] or packed [tokens, heads, channels]
DSV4_RANKS = {4: "[batch, heads, sequence, channels]"}
YARN_KEYS = ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings")


def kernels_run_on(device: torch.device) -> bool:
    """Whether the Triton kernels run on tensors of `device`: CUDA, or the CPU in interpreter mode."""
    return device.type == "cuda" or (device.type == "cpu" and INTERPRET)


def wants_autograd(x: torch.Tensor) -> bool:
    """Whether a call must go through the autograd.Function: a gradient is wanted, or forward-mode AD
    is active (a dual tensor does not require grad; the Function then refuses it, having no jvp,
    where the bare launcher would silently drop the tangent)."""
    return (x.requires_grad and torch.is_grad_enabled()) or torch.autograd.forward_ad._current_level >= 0


# --- scalars -----------------------------------------------------------------------------------------


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def check_even_int(name: str, value, minimum: int) -> int:
    check_int(name, value, minimum)
    if value % 2:
        raise ValueError(f"{name}: expected an even int, got {value}")
    return value


def check_real(name: str, value, above: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= above:
        raise ValueError(f"{name}: expected a finite number > {above}, got {value}")
    return float(value)


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value


def check_format(name: str, value) -> str:
    if value not in QKV_FORMATS:
        raise ValueError(f"{name}: expected 'bshd' or 'thd', got {value!r}")
    return value


def check_rotary(rotary, channels: int) -> None:
    if isinstance(rotary, bool) or not isinstance(rotary, int):
        raise TypeError(f"rotary: expected an int, got {type(rotary).__name__}")
    if rotary <= 0 or rotary % 2 or rotary > channels:
        raise ValueError(f"rotary: expected a positive even int <= channels ({channels}), got {rotary}")


def check_eps(eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
    if not 0 < eps < math.inf:  # also NaN; comparisons, unlike math.isfinite, trace under torch.compile
        raise ValueError(f"eps: expected a finite float > 0, got {eps}")


def check_cp(cp_size, cp_rank) -> None:
    check_int("cp_size", cp_size, 1)
    check_int("cp_rank", cp_rank, 0)
    if cp_rank >= cp_size:
        raise ValueError(f"cp_rank: expected an int < cp_size ({cp_size}), got {cp_rank}")


def check_unsqueeze_dim(unsqueeze_dim) -> None:
    if unsqueeze_dim is not None and (isinstance(unsqueeze_dim, bool) or unsqueeze_dim not in (2, -2)):
        raise ValueError(
            f"unsqueeze_dim: expected None or 2 (-2), the head dim of [batch, sequence, heads, channels], "
            f"got {unsqueeze_dim!r}"
        )


def check_rope_scaling(rope_scaling) -> tuple[float, float, float, int] | None:
    """(factor, beta_fast, beta_slow, original) when rope_scaling carries all of YARN_KEYS, else None."""
    if rope_scaling is None:
        return None
    if not isinstance(rope_scaling, Mapping):
        raise TypeError(f"rope_scaling: expected a dict or None, got {type(rope_scaling).__name__}")
    if not all(key in rope_scaling for key in YARN_KEYS):
        return None
    factor = check_real("rope_scaling['factor']", rope_scaling["factor"], 0.0)
    beta_fast = check_real("rope_scaling['beta_fast']", rope_scaling["beta_fast"], 0.0)
    beta_slow = check_real("rope_scaling['beta_slow']", rope_scaling["beta_slow"], 0.0)
    if beta_fast < beta_slow:
        raise ValueError(f"rope_scaling['beta_fast']: expected >= beta_slow ({beta_slow}), got {beta_fast}")
    original = check_int(
        "rope_scaling['original_max_position_embeddings']",
        rope_scaling["original_max_position_embeddings"],
        1,
    )
    return factor, beta_fast, beta_slow, original


# --- tensors -----------------------------------------------------------------------------------------


def check_tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def check_device(name: str, t: torch.Tensor) -> None:
    if kernels_run_on(t.device):
        return
    expected = "a CUDA tensor (or a CPU tensor with TRITON_INTERPRET=1)"
    raise ValueError(f"{name}: expected {expected}, got a tensor on {t.device}")


def check_x(x, name: str = "x", ranks: dict[int, str] = DSV4_RANKS, even_channels=False, device=True):
    """x: a bf16/fp16/fp32 tensor of one of `ranks` (rank -> layout words); with even_channels an even
    channel count; with device on CUDA (or the CPU in interpreter mode)."""
    check_tensor(name, x)
    if x.dim() not in ranks:
        expected = " or ".join(f"rank {r} {words}" for r, words in ranks.items())
        raise ValueError(f"{name}: expected {expected}, got shape {list(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype bfloat16, float16 or float32, got {x.dtype}")
    if even_channels and x.shape[-1] % 2:
        raise ValueError(f"{name}: expected an even channel count, got {x.shape[-1]}")
    if device:
        check_device(name, x)
    return x


def check_writable(x: torch.Tensor, name: str = "x") -> None:
    """x can be written in place: no two of its elements share memory. Sufficient check: with the dims
    of size > 1 sorted by stride, each stride is at least the extent of the dims inside it (a stride 0,
    an expanded view, or an overlapping as_strided view fails it)."""
    dims = sorted((stride, size) for stride, size in zip(x.stride(), x.shape, strict=True) if size > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            raise ValueError(
                f"{name}: expected a tensor whose elements do not share memory (to be written in place), "
                f"got shape {list(x.shape)} with strides {list(x.stride())}"
            )
        extent = stride * size
    return None


def check_table(name: str, t, x: torch.Tensor, rotary: int) -> None:
    """cos/sin: FP32 [B, S, rotary] on x's device, not requiring grad."""
    check_tensor(name, t)
    expected = (x.shape[0], x.shape[2], rotary)
    if tuple(t.shape) != expected:
        raise ValueError(f"{name}: expected shape [batch, sequence, rotary] = {list(expected)}, got {list(t.shape)}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name}: expected dtype float32, got {t.dtype}")
    if t.requires_grad:
        raise ValueError(f"{name}: expected a fixed table (requires_grad=False); the kernels give it no gradient")
    if t.device != x.device:
        raise ValueError(f"{name}: expected a tensor on x's device {x.device}, got {t.device}")


# --- rope_utils' tensors -------------------------------------------------------------------------------


def check_complex_table(freqs_cis, x: torch.Tensor, tokens: tuple[int, ...], qkv_format: str) -> None:
    """The complex format: complex64 [*tokens, channels/2] on x's device."""
    check_tensor("freqs_cis", freqs_cis)
    if freqs_cis.dtype != torch.complex64:
        raise TypeError(f"freqs_cis: expected dtype complex64, got {freqs_cis.dtype}")
    expected = [*tokens, x.shape[-1] // 2]
    if list(freqs_cis.shape) != expected:
        words = "[batch, sequence, channels/2]" if qkv_format == "bshd" else "[tokens, channels/2]"
        raise ValueError(f"freqs_cis: expected shape {words} = {expected}, got {list(freqs_cis.shape)}")
    if freqs_cis.device != x.device:
        raise ValueError(f"freqs_cis: expected a tensor on x's device {x.device}, got {freqs_cis.device}")


def check_fused_table(freqs_cis, q: torch.Tensor, positions: int) -> None:
    """The fused format: fixed float32 [2, >= positions, channels] on q's device."""
    check_tensor("freqs_cis", freqs_cis)
    d = q.shape[-1]
    if freqs_cis.dtype != torch.float32:
        raise TypeError(
            f"freqs_cis: expected the fused table (float32 [2, positions, channels], from "
            f"freqs_cis_from_position_ids(..., for_fused_rope=True)) for rope_fusion=True, "
            f"got {freqs_cis.dtype}"
        )
    if freqs_cis.dim() != 3 or freqs_cis.shape[0] != 2 or freqs_cis.shape[2] != d or freqs_cis.shape[1] < positions:
        raise ValueError(
            f"freqs_cis: expected the fused shape [2, positions >= {positions}, {d}], got {list(freqs_cis.shape)}"
        )
    if freqs_cis.requires_grad:
        raise ValueError("freqs_cis: expected a fixed table (requires_grad=False) for rope_fusion=True")
    if freqs_cis.device != q.device:
        raise ValueError(f"freqs_cis: expected a tensor on q's device {q.device}, got {freqs_cis.device}")


def check_position_ids(position_ids, qkv_format: str) -> None:
    """Integer [B, S] for bshd, [T] for thd."""
    rank = 2 if qkv_format == "bshd" else 1
    check_tensor("position_ids", position_ids)
    if position_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"position_ids: expected dtype int32 or int64, got {position_ids.dtype}")
    if position_ids.dim() != rank:
        words = "[batch, sequence]" if rank == 2 else "[tokens]"
        raise ValueError(
            f"position_ids: expected rank {rank} {words} for {qkv_format}, got shape {list(position_ids.shape)}"
        )


def check_freqs(freqs) -> None:
    """Inverse frequencies: float32 [d/2]."""
    check_tensor("freqs", freqs)
    if freqs.dtype != torch.float32 or freqs.dim() != 1:
        raise TypeError(f"freqs: expected a float32 [d/2] tensor, got {freqs.dtype} {list(freqs.shape)}")


def check_qk(q, k, format: str) -> None:
    """q and k: [B, S, H, d] (bshd) or [T, H, d] (thd), the same tokens and channels, on one device."""
    rank, words = (4, "[batch, sequence, heads, channels]") if format == "bshd" else (3, "[tokens, heads, channels]")
    check_x(q, "q", {rank: words}, even_channels=True, device=False)
    check_x(k, "k", {rank: words}, even_channels=True, device=False)
    if k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: expected q's tokens and channels {list(q.shape[:-2])}, {q.shape[-1]}, got {list(k.shape)}"
        )
    if k.device != q.device:
        raise ValueError(f"k: expected a tensor on q's device {q.device}, got {k.device}")


def check_sequence_lengths(cu_seqlens, q: torch.Tensor, format: str, cp_size: int) -> list[int]:
    """Global lengths of the sequences the local tokens of q belong to (one sequence without cu_seqlens),
    checked: cu_seqlens (read on the host) non-decreasing from 0 to the global token count, each length
    divisible by 2 * cp_size."""
    local = q.shape[1] if format == "bshd" else q.shape[0]
    if cu_seqlens is None:
        lengths = [local * cp_size]
    else:
        if format != "thd":
            raise ValueError("cu_seqlens: expected None for format 'bshd' (packed sequences are thd)")
        check_tensor("cu_seqlens", cu_seqlens)
        if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(
                f"cu_seqlens: expected an int32/int64 [sequences + 1] tensor, got {cu_seqlens.dtype} "
                f"{list(cu_seqlens.shape)}"
            )
        bounds = cu_seqlens.tolist()
        lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
        if bounds[0] != 0 or min(lengths) < 0:
            raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0, got {bounds}")
        if bounds[-1] != local * cp_size:
            raise ValueError(
                f"cu_seqlens: expected the global token count q.shape[0] * cp_size = {local * cp_size} "
                f"as last offset, got {bounds[-1]}"
            )
    if cp_size > 1 and any(n % (2 * cp_size) for n in lengths):
        raise ValueError(
            f"cp_size: expected every sequence length divisible by 2 * cp_size = {2 * cp_size}, got lengths {lengths}"
        )
    return lengths
