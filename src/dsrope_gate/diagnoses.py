"""Named causes of elements outside the model: known limits of common ways to compute an op, each checked
element by element on a judged case, so that a report can say why an implementation does not conform and
not only that it does not. A diagnosis explains; it changes a verdict only where the user accepts it by name.

A Diagnosis's `explains(case, inputs, got64, model, outside)` is true when every element outside the model
(`outside`, a bool mask over the output) is one that the named cause produces. The op's record
(dsrope_gate.ops) lists its diagnoses per direction; dsrope_gate.conformance.violations applies them.

A user may accept a known limit knowingly (`--accept NAME`, `accept=[NAME]`): where the named diagnosis
explains every element outside the model of a direction, those elements do not fail its verdict, which reads
"conforms (N elements accepted: NAME)"; a diagnosis that does not explain every one of them accepts none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from dsrope_reference.floats import exact_sum, round_nearest
from dsrope_reference.rope import partial_rope

TINY = 2.0**-126  # FP32's smallest normal number
SUBNORMAL_STEP = 2.0**-149  # FP32's smallest subnormal: the spacing of its subnormal grid


@dataclass(frozen=True)
class Diagnosis:
    name: str  # the JSON's word for it
    text: str  # what the report says
    explains: Callable  # (case, inputs, got64, model, outside) -> bool


def rstd_cubed_underflows(case, inputs, got64: torch.Tensor, model, outside: torch.Tensor) -> bool:
    """qnorm_rope's backward, the contract's dx = rnd(r (g' - xhat mean(g' xhat))), xhat = x r, expanded:
    r g' - x r^3 mean(g' x). Autograd through F.rms_norm's composite (pow, mean, add, rsqrt, mul) forms that
    r^3 in FP32 (rsqrt's derivative, -0.5 grad r^3 with r its FP32 result), below FP32's normal range in
    rows of rms above 2^42 (r < 2^-42), 0 above 2^49.7. True when every element outside the model lies in
    such a row and inside the model of the backward with r^3 rounded to FP32 there (any value within half a
    step of FP32's subnormal grid, 2^-150, and r's own FP32 error of r^3): the projection term's bits lost,
    not another formula."""
    from dsrope_reference.qnorm_rope import exact_rstd  # mpmath's import, at first use

    x, cos, sin, grad = inputs
    x64 = x.detach().to("cpu", torch.float64)
    r, delta, _ = exact_rstd(x64, case.eps)
    cubed = r**3
    underflow = ((cubed < TINY) & (r > 0))[..., None].expand_as(outside)
    if not bool(underflow[outside].all()):
        return False
    g = partial_rope(grad.detach(), cos, sin, case.rotary, inverse=True).ref  # boundary 2, as the model has it
    projection = x64 * exact_sum(g * x64, keepdim=True) / x64.shape[-1]  # x mean(g' x), exact products
    # r^3 as FP32 holds it: rounded onto the subnormal grid (half a step), off by r's own relative error
    # (tripled in r^3; it covers the rounding of r*r too)
    slack = SUBNORMAL_STEP / 2 + 3 * delta * cubed
    low, high = ((cubed - slack).clamp(min=0)[..., None], (cubed + slack)[..., None])
    near, far = r[..., None] * g - projection * low, r[..., None] * g - projection * high
    lo = round_nearest(torch.minimum(near, far), x.dtype) - (model.ref - model.lo)  # the model's own room
    hi = round_nearest(torch.maximum(near, far), x.dtype) + (model.hi - model.ref)
    return bool(((got64 >= lo) & (got64 <= hi))[outside].all())


RSTD_CUBED_UNDERFLOW = Diagnosis(
    name="fp32 underflow of rstd^3",
    text="every element outside the model lies in a row of rms above 2^42, where rstd^3 is below FP32's normal "
    "range, and is the contract's backward with rstd^3 rounded to FP32 there: the known limit of autograd "
    "through F.rms_norm's composite (torch's CPU rms_norm backward), which forms rstd^3 where the contract "
    "forms xhat = x * rstd first",
    explains=rstd_cubed_underflows,
)

# every named diagnosis, by the name a report gives it and `--accept` / accept= takes
KNOWN = {d.name: d for d in (RSTD_CUBED_UNDERFLOW,)}


def check_accepted(names) -> tuple[str, ...]:
    """The names of diagnoses a user accepts knowingly; a ValueError naming the known ones for any other."""
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise ValueError(f"accept: unknown diagnosis {unknown}; known: {sorted(KNOWN)}")
    return tuple(names)
