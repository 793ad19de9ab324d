"""The golden store: the reference's outputs on fixed inputs (dsrope_gate.case_sets.GOLDEN), stored and
hashed, and the files of the per-platform kernel bit snapshots (dsrope_gate.snapshots runs the kernels);
bytes <-> tensors, hashes, the manifest, diffs.

    python -m tools.golden                    regenerate from the reference in memory, diff vs golden/
    python -m tools.golden --update           ... and write golden/reference/ and golden/manifest.json
    python -m tools.golden --update-snapshot  run the kernels on the stored inputs and record
                                              golden/snapshots/<key>.safetensors (+ .json sidecar)
    `nox -s golden -- <flags>` runs the same in a fresh CPU venv (kernels interpreted).

The reference goldens are computed from `reference/` only, never from the kernels: fixed seeds,
FP64 reference, deterministic serialization (safetensors with one metadata entry, JSON with
sorted keys), so regenerating gives the same bytes. One input is FP32 on purpose: the V3 cases'
cos/sin are the table DeepSeek-V3 was trained with (upstream's FP32 pow and cosf/sinf on CPU, as
reference/rope_utils.py transcribes it): regenerating gives the same bytes where torch's CPU pow
and the C library's cosf/sinf give the bits they gave when recorded (torch 2.13, glibc 2.36, AVX-512).

golden/reference/<case>.safetensors holds, per case:
  input.<name>     the logical values (contiguous) in the dtype the kernel gets; the layout the kernel
                   is run with (dsrope_gate.layouts.Layout fields, and the strides and storage offset they
                   give) is in the manifest; `laid_out_inputs` rebuilds the strided view.
  <stage>.ref      the reference value of a stage (correctly rounded in the case dtype; the exact
                   rstd is FP64), in the narrowest of (case dtype, float32, float64) that holds it.
  <stage>.lo_steps, <stage>.hi_steps   for stages a kernel outputs: the error model's interval
                   [lo, hi], as the number of representable values (case dtype) from ref down to lo
                   and up to hi, int8 where it fits (almost always 0 or 1); floats would triple the
                   folder. Where ref, lo, hi are not all in the case dtype: <stage>.lo, <stage>.hi.
golden/manifest.json: versions, error model, cases (seeds, shapes, layouts, dtypes), and the sha256
  of every file and every tensor's bytes, and of itself (`manifest_sha256`).
golden/snapshots/<key>.safetensors: kernel outputs `<case>/<kernel>.<output>` on one platform; the
  sidecar <key>.json holds their hashes and the hashes of the inputs they were computed from.
Nothing is pickled. The store is found without assuming a checkout: `golden_root()`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from dsrope_reference.floats import NAN_VS_NUMBER, from_ordered, ordered, same_values, ulp_distance

from dsrope_gate.case_sets import GOLDEN_CASES as CASES
from dsrope_gate.cases import DTYPES, Case, Inputs, Seeded
from dsrope_gate.layouts import Layout, materialize
from dsrope_gate.ops import OPS


class GoldenError(Exception):
    """A golden case or file is missing, corrupted, or does not match its record or manifest."""


def golden_root() -> Path:
    """The golden store: $DSROPE_GOLDEN when set, else the checkout's golden/ beside the package's src/
    (an editable install or a PYTHONPATH into a checkout), else the copy a pip install puts in the
    environment's data folder (pyproject's data-files: <prefix>/share/dsrope/golden). Where none is there
    the checkout's path is returned; it does not exist, and every reader says the manifest is missing,
    naming it."""
    import sysconfig

    if os.environ.get("DSROPE_GOLDEN"):
        return Path(os.environ["DSROPE_GOLDEN"]).resolve()
    checkout = Path(__file__).resolve().parents[2] / "golden"
    installed = Path(sysconfig.get_path("data")) / "share" / "dsrope" / "golden"
    if not (checkout / "manifest.json").is_file() and (installed / "manifest.json").is_file():
        return installed
    return checkout


FORMAT = 1
# Bump when the reference changes an interval on purpose (the regenerated lo/hi then differ and
# `--update` stores them): it names the error model the stored intervals come from.
ERROR_MODEL_VERSION = (
    "1: rope = reference/rope.py rotation_interval (2u(|p|+|q|) + FP32 flush slack, exact when FP32-exact); "
    "qnorm_rope = reference/qnorm_rope.py (rstd gamma(D+4) + rsqrt 2^-22, boundary-1 box, backward bound B)"
)


# --- cases <-> manifest records ------------------------------------------------------------------------

# The Layout fields a case uses (Layout may grow others, with defaults: they are not recorded).
LAYOUT_FIELDS = ("order", "pad", "step", "offset", "broadcast")


def case_record(case: Case, inputs: dict[str, torch.Tensor]) -> dict:
    """The manifest's description of a golden case: seeds, shapes, dtypes, ops, each input's layout."""
    record = dict(
        name=case.name,
        seed=case.values.seed,
        dtype=case.dtype,
        shape=list(case.shape),
        rotary=case.rotary,
        eps=case.eps,
        values=case.values.values,
        x_layout=case.x_layout.name,
        grad_layout=case.grad_layout.name,
        table_layout=case.cos_layout.name,
        kernels=list(case.ops),
        qkv_format=case.qkv_format,
        unsqueeze_dim=case.unsqueeze_dim,
        file=f"reference/{case.name}.safetensors",
        layouts={},
    )
    for name, layout in case.layouts().items():
        view = materialize(inputs[name], layout)
        fields = {k: getattr(layout, k) for k in LAYOUT_FIELDS}
        fields = {k: (list(v) if isinstance(v, tuple) else v) for k, v in fields.items()}
        record["layouts"][name] = dict(
            fields, shape=list(view.shape), strides=list(view.stride()), storage_offset=view.storage_offset()
        )
    return record


def case_from_record(record: dict) -> Case:
    """The Case a manifest record describes (a store written by another version of the gate included)."""
    layouts = {}
    for name, rec in record["layouts"].items():
        fields = {k: (tuple(rec[k]) if isinstance(rec[k], list) else rec[k]) for k in LAYOUT_FIELDS}
        named = record["table_layout" if name in ("cos", "sin") else f"{name}_layout"]
        layouts[name] = Layout(**fields, name=named)
    return Case(
        name=record["name"],
        shape=tuple(record["shape"]),
        rotary=record["rotary"],
        dtype=record["dtype"],
        values=Seeded(record["seed"], record["values"]),
        x_layout=layouts["x"],
        grad_layout=layouts["grad"],
        cos_layout=layouts["cos"],
        sin_layout=layouts["sin"],
        eps=record["eps"],
        ops=tuple(record["kernels"]),
        kind="golden",
        qkv_format=record["qkv_format"],
        unsqueeze_dim=record["unsqueeze_dim"],
    )


def laid_out_inputs(record: dict, tensors: dict[str, torch.Tensor], device) -> tuple[Case, Inputs]:
    """A stored case's Case and its inputs as an implementation gets them: each stored logical tensor in its
    recorded layout on `device`, checked against the recorded strides, offset and values."""
    case = case_from_record(record)
    logical = {k.removeprefix("input."): v for k, v in tensors.items() if k.startswith("input.")}
    laid = case.lay_out(logical, device)._asdict()
    for name, rec in record["layouts"].items():
        view = laid[name]
        got = (list(view.shape), list(view.stride()), view.storage_offset())
        want = (rec["shape"], rec["strides"], rec["storage_offset"])
        if got != want:
            raise GoldenError(
                f"case {record['name']}: input {name} rebuilt as (shape, strides, offset) {got}, "
                f"the manifest records {want}"
            )
        if not same_values(view.cpu().double(), logical[name].double()):
            raise GoldenError(f"case {record['name']}: input {name} differs from its stored values in its layout")
    return case, Inputs(**laid)


def judged_stages(case: Case) -> list[str]:
    """`op.stage` of every stage an implementation outputs for the case's ops (stored with their interval)."""
    return [f"{name}.{stage}" for name in case.ops for stage in OPS[name].stages]


def reference_stages(case: Case, inputs: dict[str, torch.Tensor]) -> dict:
    """`op.stage` -> reference Model of every stage of the case's ops, on its logical inputs."""
    logical = Inputs(inputs["x"], inputs["cos"], inputs["sin"], inputs["grad"])
    return {
        f"{name}.{stage}": model for name in case.ops for stage, model in OPS[name].reference(case, logical).items()
    }


# --- float values ------------------------------------------------------------------------------------


def exact_in(t64: torch.Tensor, dtype: torch.dtype) -> bool:
    return same_values(t64.to(dtype).to(torch.float64), t64)


def narrowest(t64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    for candidate in (dtype, torch.float32):
        if exact_in(t64, candidate):
            return t64.to(candidate)
    return t64


def smallest_int(t: torch.Tensor) -> torch.Tensor:
    for candidate in (torch.int8, torch.int16, torch.int32):
        info = torch.iinfo(candidate)
        if t.numel() == 0 or (t.min() >= info.min and t.max() <= info.max):
            return t.to(candidate)
    return t


# --- encoding ---------------------------------------------------------------------------------------


def encode_stage(name: str, model, dtype: torch.dtype, with_interval: bool) -> dict[str, torch.Tensor]:
    ref, lo, hi = (t.to("cpu", torch.float64).contiguous() for t in (model.ref, model.lo, model.hi))
    out = {f"{name}.ref": narrowest(ref, dtype)}
    if not with_interval:
        return out
    if exact_in(ref, dtype) and exact_in(lo, dtype) and exact_in(hi, dtype):
        r = ordered(ref.to(dtype))
        nan = ref.isnan()
        lo_steps = torch.where(nan, 0, r - ordered(lo.to(dtype)))
        hi_steps = torch.where(nan, 0, ordered(hi.to(dtype)) - r)
        encoded = {f"{name}.lo_steps": smallest_int(lo_steps), f"{name}.hi_steps": smallest_int(hi_steps)}
        decoded = decode_stage(name, out | encoded)
        if same_values(decoded["lo"], lo) and same_values(decoded["hi"], hi):
            return out | encoded
    return out | {f"{name}.lo": narrowest(lo, dtype), f"{name}.hi": narrowest(hi, dtype)}


def decode_stage(name: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{"ref", "lo", "hi"} in FP64 (lo/hi only when stored)."""
    ref = tensors[f"{name}.ref"]
    out = {"ref": ref.to(torch.float64)}
    for side, sign in (("lo", -1), ("hi", 1)):
        if f"{name}.{side}" in tensors:
            out[side] = tensors[f"{name}.{side}"].to(torch.float64)
        elif f"{name}.{side}_steps" in tensors:
            steps = tensors[f"{name}.{side}_steps"].to(torch.int64)
            moved = from_ordered(ordered(ref) + sign * steps, ref.dtype)
            out[side] = torch.where(steps == 0, ref, moved).to(torch.float64)  # keeps NaN payloads
    return out


def encode_case(case: Case, inputs: dict[str, torch.Tensor], stages: dict) -> dict[str, torch.Tensor]:
    tensors = {f"input.{k}": v.contiguous() for k, v in inputs.items()}
    judged = judged_stages(case)
    for name, model in stages.items():
        tensors |= encode_stage(name, model, DTYPES[case.dtype], with_interval=name in judged)
    return tensors


def logical(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Stored tensors -> name: values (input.x, qnorm_rope.out.ref, .lo, .hi, ...), each in the narrowest
    of (case dtype, float32, float64) that holds it, for diffs in ULPs."""
    out = {k: v for k, v in tensors.items() if k.startswith("input.")}
    stages = {k.rsplit(".", 1)[0] for k in tensors if not k.startswith("input.")}
    for stage in sorted(stages):
        for side, t in decode_stage(stage, tensors).items():
            out[f"{stage}.{side}"] = narrowest(t, dtype)
    return out


# --- serialization and hashes -------------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def tensor_entries(tensors: dict[str, torch.Tensor]) -> dict:
    return {
        k: {
            "dtype": str(v.dtype).removeprefix("torch."),
            "shape": list(v.shape),
            "sha256": sha256(tensor_bytes(v)),
        }
        for k, v in sorted(tensors.items())
    }


def serialize(tensors: dict[str, torch.Tensor], description: dict) -> bytes:
    """safetensors bytes; one metadata entry (a JSON string with sorted keys) keeps the header fixed."""
    from safetensors.torch import save

    meta = {"dsrope": json.dumps(description, sort_keys=True)}
    return save({k: v.contiguous() for k, v in sorted(tensors.items())}, metadata=meta)


def canonical(obj: dict) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode()


def with_self_hash(obj: dict, key: str) -> bytes:
    body = {k: v for k, v in obj.items() if k != key}
    return canonical(body | {key: sha256(canonical(body))})


def versions() -> dict:
    import numpy
    import safetensors
    import triton

    return {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": numpy.__version__,
        "safetensors": safetensors.__version__,
        "python": sys.version.split()[0],
    }


def relname(path: Path) -> str:
    try:
        return str(path.relative_to(golden_root().parent))
    except ValueError:
        return str(path)


def read_json(path: Path, self_hash_key: str) -> dict:
    """A JSON file written by this tool: present, canonical, and matching its own hash."""
    if not path.is_file():
        raise GoldenError(f"{relname(path)}: missing")
    raw = path.read_bytes()
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise GoldenError(f"{relname(path)}: not valid JSON ({e})") from None
    if not isinstance(obj, dict) or canonical(obj) != raw:
        raise GoldenError(f"{relname(path)}: not byte-identical to its canonical form (edited or corrupted)")
    if with_self_hash(obj, self_hash_key) != raw:
        raise GoldenError(f"{relname(path)}: {self_hash_key} does not match its content (edited or corrupted)")
    return obj


def read_tensors(path: Path, entry: dict) -> dict[str, torch.Tensor]:
    """A safetensors file whose bytes and tensors match `entry` (sha256, tensors); parsed from the very
    bytes that were hashed."""
    from safetensors.torch import load

    if not path.is_file():
        raise GoldenError(f"{relname(path)}: missing (listed in its manifest)")
    raw = path.read_bytes()
    got = sha256(raw)
    if got != entry["sha256"]:
        raise GoldenError(f"{relname(path)}: sha256 {got} does not match the manifest's {entry['sha256']}")
    try:
        tensors = load(raw)
    except Exception as e:  # safetensors raises its own error types
        raise GoldenError(f"{relname(path)}: not a readable safetensors file ({e})") from None
    entries = tensor_entries(tensors)
    if entries != entry["tensors"]:
        bad = [k for k in sorted(set(entries) | set(entry["tensors"])) if entries.get(k) != entry["tensors"].get(k)]
        raise GoldenError(f"{relname(path)}: tensors differ from the manifest: {bad[:5]}")
    return tensors


# --- the stored reference goldens -------------------------------------------------------------------------


def manifest_path(root: Path) -> Path:
    return root / "manifest.json"


def read_manifest(root: Path | None = None) -> dict:
    root = root or golden_root()
    manifest = read_json(manifest_path(root), "manifest_sha256")
    if manifest.get("format") != FORMAT:
        raise GoldenError(f"{relname(manifest_path(root))}: format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def load_case(root: Path, manifest: dict, name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(case record, stored tensors) of one case, after checking its file's hashes."""
    records = {c["name"]: c for c in manifest["cases"]}
    if name not in records:
        raise GoldenError(f"{relname(manifest_path(root))}: no case {name!r}")
    record = records[name]
    return record, read_tensors(root / record["file"], manifest["files"][record["file"]])


def verify_all(root: Path | None = None) -> dict:
    """Check every golden file against its hashes (reference files, snapshots); return the manifest."""
    root = root or golden_root()
    manifest = read_manifest(root)
    for rel, entry in sorted(manifest["files"].items()):
        read_tensors(root / rel, entry)
    listed = {root / rel for rel in manifest["files"]}
    for path in sorted((root / "reference").glob("*")):
        if path not in listed:
            raise GoldenError(f"{relname(path)}: not listed in {relname(manifest_path(root))}")
    snapshots = root / "snapshots"
    data_files = {path.name for path in snapshots.glob("*") if path.suffix != ".json"}
    for sidecar in sorted(snapshots.glob("*.json")):
        meta, _ = read_snapshot(sidecar)
        data_files.discard(meta["file"])
    if data_files:
        name = sorted(data_files)[0]
        raise GoldenError(f"{relname(snapshots / name)}: no sidecar .json in {relname(snapshots)} names it")
    return manifest


def generate(cases: list[Case] = CASES) -> tuple[dict[str, bytes], bytes]:
    """Reference golden files (relative path -> bytes) and the manifest bytes, from the reference."""
    files, entries, records = {}, {}, []
    for case in cases:
        inputs = case.logical()
        record = case_record(case, inputs)
        tensors = encode_case(case, inputs, reference_stages(case, inputs))
        data = serialize(tensors, {"case": record, "error_model": ERROR_MODEL_VERSION, "format": FORMAT})
        files[record["file"]] = data
        entries[record["file"]] = {
            "sha256": sha256(data),
            "bytes": len(data),
            "tensors": tensor_entries(tensors),
        }
        records.append(record)
    manifest = {
        "about": "dsrope golden tensors: written by `python -m tools.golden --update`; do not edit by hand",
        "format": FORMAT,
        "error_model": ERROR_MODEL_VERSION,
        "produced_by": versions(),
        "cases": records,
        "files": entries,
    }
    return files, with_self_hash(manifest, "manifest_sha256")


def input_hashes(tensors: dict[str, torch.Tensor]) -> str:
    """One hash of a case's inputs: a snapshot recorded from other inputs is stale."""
    return sha256(canonical(tensor_entries({k: v for k, v in tensors.items() if k.startswith("input.")})))


# --- diffs ------------------------------------------------------------------------------------------------


@dataclass
class Change:
    case: str
    tensor: str
    changed: int  # elements whose bits differ
    total: int
    max_ulp: int | None  # None: the tensor is new, gone, or changed shape
    unit: str = ""  # the dtype the ULPs count in

    def __str__(self) -> str:
        if self.max_ulp is None:
            return f"  {self.case}  {self.tensor}: {self.changed} elements (added, removed or reshaped)"
        if self.max_ulp >= NAN_VS_NUMBER:
            ulp = "NaN vs number"
        elif self.max_ulp == 0:
            ulp = f"0 ulp ({self.unit}; only NaN payloads or signs of zero changed)"
        else:
            ulp = f"{self.max_ulp} ulp ({self.unit})"
        return f"  {self.case}  {self.tensor}: {self.changed} / {self.total} elements, max {ulp}"


def diff_tensors(case: str, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> list[Change]:
    """Bitwise changes between two name -> float tensor maps, in ULPs of the tensors' dtype (FP64 where
    the dtype itself changed)."""
    changes = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is None or b is None or a.shape != b.shape:
            n = (a if b is None else b).numel()
            changes.append(Change(case, name, n, n, None))
            continue
        if a.dtype != b.dtype:
            a, b = a.to(torch.float64), b.to(torch.float64)
        same = ordered(a) == ordered(b)
        if bool(same.all()):
            continue
        ulps = ulp_distance(a, b)
        unit = str(a.dtype).removeprefix("torch.")
        changes.append(Change(case, name, int((~same).sum()), a.numel(), int(ulps.max()), unit))
    return changes


def summary(changes: list[Change], what: str) -> str:
    """One line (cases, tensors, elements, largest change in ULPs), then one line per changed tensor."""
    if not changes:
        return f"{what}: no change"
    cases = sorted({c.case for c in changes})
    elements = sum(c.changed for c in changes)
    measured = [c for c in changes if c.max_ulp is not None]
    worst = max(measured, key=lambda c: c.max_ulp, default=None)
    if worst is None:
        largest = "n/a"
    elif worst.max_ulp >= NAN_VS_NUMBER:
        largest = "NaN vs number"
    else:
        largest = f"{worst.max_ulp} ulp ({worst.unit}, {worst.case} {worst.tensor})"
    head = (
        f"{what}: {len(cases)} cases changed ({', '.join(cases)}), {len(changes)} tensors, "
        f"{elements} elements, largest change {largest}"
    )
    return "\n".join([head] + [str(c) for c in changes])


def reference_report(root: Path, files: dict[str, bytes], manifest_bytes: bytes) -> tuple[str, bool]:
    """Diff of freshly generated reference goldens against the stored ones: (report, changed)."""
    from safetensors.torch import load

    lines = []
    new_manifest = json.loads(manifest_bytes)
    try:
        old_manifest = read_manifest(root)
    except GoldenError as e:
        old_manifest = {"cases": [], "files": {}}
        lines.append(f"stored manifest unusable: {e}")
    for key in ("error_model", "produced_by"):
        if old_manifest.get(key) != new_manifest[key]:
            lines.append(f"{key}: {old_manifest.get(key)!r} -> {new_manifest[key]!r}")
    old_records = {c["name"]: c for c in old_manifest["cases"]}
    changes = []
    for record in new_manifest["cases"]:
        name, rel = record["name"], record["file"]
        dtype = DTYPES[record["dtype"]]
        new = logical(load(files[rel]), dtype)
        old = {}
        if name in old_records:
            if old_records[name] != record:
                keys = sorted(
                    k for k in set(record) | set(old_records[name]) if record.get(k) != old_records[name].get(k)
                )
                lines.append(f"case {name}: description changed ({', '.join(keys)})")
            try:
                old = logical(read_tensors(root / rel, old_manifest["files"][rel]), dtype)
            except (GoldenError, KeyError) as e:
                lines.append(f"case {name}: stored file unusable: {e}")
        else:
            lines.append(f"case {name}: new")
        changes += diff_tensors(name, old, new)
    for name in sorted(set(old_records) - {c["name"] for c in new_manifest["cases"]}):
        lines.append(f"case {name}: removed")
    stored_bytes = {rel: (root / rel).read_bytes() if (root / rel).is_file() else None for rel in files}
    identical = all(stored_bytes[rel] == data for rel, data in files.items())
    lines.append(summary(changes, "reference goldens"))
    lines.append(f"files: {'byte-identical to' if identical else 'differ from'} the stored ones")
    changed = bool(changes) or not identical or any(line.startswith("case ") for line in lines)
    return "\n".join(lines), changed


def write_reference(root: Path, files: dict[str, bytes], manifest_bytes: bytes) -> None:
    (root / "reference").mkdir(parents=True, exist_ok=True)
    for path in (root / "reference").glob("*"):
        if str(path.relative_to(root)) not in files:
            path.unlink()  # a case no longer in CASES
    for rel, data in files.items():
        atomic_write(root / rel, data)
    atomic_write(manifest_path(root), manifest_bytes)


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


# --- the snapshot files (dsrope_gate.snapshots records and compares them) -------------------------------------


def snapshot_paths(root: Path, key: dict) -> tuple[Path, Path]:
    folder, slug = root / "snapshots", key_slug(key)
    return folder / f"{slug}.safetensors", folder / f"{slug}.json"


def key_slug(key: dict) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", f"{key['device']}-triton-{key['triton']}".lower()).strip("-")


def read_snapshot(sidecar: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(sidecar, tensors) of a snapshot, after checking both against the sidecar's hashes."""
    meta = read_json(sidecar, "sidecar_sha256")
    return meta, read_tensors(sidecar.with_name(meta["file"]), meta)


def write_snapshot(root: Path, key: dict, outputs: dict[str, torch.Tensor], inputs: dict[str, str]) -> Path:
    """Store a platform's kernel outputs (`case/op.stage` -> tensor) and the hashes of the inputs they were
    computed from; returns the data file's path."""
    data_path, sidecar = snapshot_paths(root, key)
    data = serialize(outputs, {"key": key})
    meta = {
        "about": "kernel outputs on one platform: written by `python -m tools.golden --update-snapshot`",
        "key": key,
        "produced_by": versions(),
        "file": data_path.name,
        "sha256": sha256(data),
        "bytes": len(data),
        "tensors": tensor_entries(outputs),
        "inputs": inputs,
    }
    data_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(data_path, data)
    atomic_write(sidecar, with_self_hash(meta, "sidecar_sha256"))
    return data_path
