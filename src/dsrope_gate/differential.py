"""Implementations this project did not write, for the differential checks (tests/test_vs_*.py and
tools/verify.py's "vs" rows): transformers' DeepSeek-V3 rotary functions, and the eager chains of
stock torch ops that docs/contract.md says the DSV4 kernels equal.

transformers (modeling_deepseek_v3, pinned in pyproject's test extra) takes q, k [B, H, S, d] (or any
layout whose token dims match cos after `unsqueeze_dim`) and cos, sin [B, S, d] built as cat(f, f):
pair j's value sits in entries j and j + d/2. Two facts about it shape every comparison:
- apply_rotary_pos_emb_interleave pairs channels (2j, 2j + 1) but returns the rotated pairs
  de-interleaved: pair j's first output in channel j, its second in j + d/2 (a fixed permutation
  of q and k alike, which leaves every q.k unchanged). Ours keeps each pair in place (docs/contract.md), so
  its output is compared with `pairs_in_place` of theirs.
- it computes in the input's dtype: in bf16/fp16 every product and the sum round to that dtype
  (a different function, tests/test_vs_transformers.py shows it). To compare with ours (FP32 math,
  one rounding) it runs here in FP32 on the upcast inputs, and its result is rounded once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsrope_gate.pins import PINS
from dsrope_gate.semantics import rotate_fp32

TRANSFORMERS_MISSING = (
    f"transformers is not installed (pyproject's test extra pins {PINS['transformers']}; "
    "`pip install -e '.[test]'`): the differential checks against its DeepSeek-V3 rotary code need it"
)


def transformers_deepseek_v3():
    """transformers' DeepSeek-V3 modeling module, or None when transformers is not installed."""
    try:
        from transformers.models.deepseek_v3 import modeling_deepseek_v3
    except ImportError:
        return None
    return modeling_deepseek_v3


# --- transformers ----------------------------------------------------------------------------------


def cos_sin_cat(freqs_cis: torch.Tensor):
    """transformers' cos, sin [*tokens, d] (cat(f, f)) from our complex table [*tokens, d/2]."""
    cos, sin = freqs_cis.real.float(), freqs_cis.imag.float()
    return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)


def pairs_in_place(t: torch.Tensor) -> torch.Tensor:
    """transformers' de-interleaved output (pair j in channels j and j + d/2) with each pair back in
    channels (2j, 2j + 1)."""
    half = t.shape[-1] // 2
    return torch.stack((t[..., :half], t[..., half:]), -1).flatten(-2)


def de_interleaved(t: torch.Tensor) -> torch.Tensor:
    """The inverse of pairs_in_place: channels (2j, 2j + 1) to j and j + d/2."""
    return torch.cat((t[..., 0::2], t[..., 1::2]), -1)


def transformers_fp32(function, q, k, cos, sin, unsqueeze_dim):
    """transformers' `function` (apply_rotary_pos_emb or apply_rotary_pos_emb_interleave) in FP32 on
    the upcast q, k (autograd reaches q and k), each result rounded once to its input's dtype."""
    q_out, k_out = function(q.float(), k.float(), cos.float(), sin.float(), unsqueeze_dim=unsqueeze_dim)
    return q_out.to(q.dtype), k_out.to(k.dtype)


def transformers_rotation_bshd(module, pairing: str, x, freqs_cis, grad):
    """transformers' rotation (`pairing` "interleaved" or "half_split") of x [B, S, H, d] by our complex
    table [B, S, d/2], in FP32 rounded once, and its input gradient for `grad`; both in our channel
    order (pairs in place)."""
    cos, sin = cos_sin_cat(freqs_cis)
    x = x.detach().requires_grad_()
    if pairing == "interleaved":
        out, _ = transformers_fp32(module.apply_rotary_pos_emb_interleave, x, x, cos, sin, unsqueeze_dim=2)
        out = pairs_in_place(out)
    else:
        out, _ = transformers_fp32(module.apply_rotary_pos_emb, x, x, cos, sin, unsqueeze_dim=2)
    (dx,) = torch.autograd.grad(out, x, grad)
    return out.detach(), dx


# --- eager chains of stock torch ops (docs/contract.md: what the DSV4 kernels equal) ------------------------


def forward_backward(function, x, grad, *args):
    """function(x, *args) and its input gradient for `grad` (None: the gradient of .sum())."""
    x = x.detach().requires_grad_()
    out = function(x, *args)
    if grad is None:
        out.sum().backward()
        return out.detach(), x.grad
    (dx,) = torch.autograd.grad(out, x, grad)
    return out.detach(), dx


def eager_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int) -> torch.Tensor:
    """x [B, H, S, D]: the trailing `rotary` channels rotated in pairs (D-R+2k, D-R+2k+1) in FP32 by
    cos, sin [B, S, >= R/2] (entry k is pair k's), cast back to x.dtype; the rest copied."""
    return rotate_fp32(x.float(), cos, sin, rotary).to(x.dtype)


def eager_qnorm_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, eps: float) -> torch.Tensor:
    """F.rms_norm over the D channels (FP32 inside, its result in x.dtype: boundary 1), then
    eager_partial_rope. Autograd through it rounds the de-rotated gradient to x.dtype where
    F.rms_norm's output meets the upcast (boundary 2)."""
    return eager_partial_rope(F.rms_norm(x, (x.shape[-1],), eps=eps), cos, sin, rotary)
