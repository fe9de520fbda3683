"""Where a fact holds: hardware identity from a fingerprint, and how close two scopes are.

A fingerprint is whatever dict the toolchain reports (arch, CPU or device model, SIMD flags and level,
cores, caches, compiler). Its id is a short hash of its identity (all but the descriptive keys, see
pytest_kope.hardware), so a new compiler version is new hardware, a re-read cache size is not.
Closeness drives recall: same operator > same family > other; same hardware > same arch > other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..hardware import fingerprint_id, level_of

# Structure weights of recall (multiplied): a fact about this very operator on this very machine counts
# fully; one about a sibling operator or a machine of the same architecture counts for less.
OPERATOR_WEIGHT = {"operator": 1.0, "family": 0.5, "other": 0.15}
HARDWARE_WEIGHT = {"hardware": 1.0, "arch": 0.6, "other": 0.3}
TOOLCHAIN_WEIGHT = {"same": 1.0, "other": 0.5}


def canonical(data: Any) -> str:
    """JSON with sorted keys: the text hashed into ids."""
    return json.dumps(data, sort_keys=True, default=str)


def _first(fp: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if fp.get(name) not in (None, "", [], {}):
            return fp[name]
    return None


def _simd(fp: Mapping[str, Any]) -> str:
    value = _first(fp, "simd", "flags", "isa")
    if isinstance(value, (list, tuple, set)):
        return " ".join(sorted(str(v) for v in value))
    return str(value or "")


def _accelerator(fp: Mapping[str, Any]) -> str:
    """The accelerator the kernels run on ("" on a CPU, the Triton interpreter's included): a Triton
    kernel's lessons belong to the H200, not to the Xeon that launched it."""
    device = str(fp.get("device") or "")
    return "" if device.lower().startswith("cpu") else device


def _model(fp: Mapping[str, Any]) -> str:
    """What the kernels run on: the accelerator when there is one, else the CPU."""
    return _accelerator(fp) or str(_first(fp, "model", "cpu", "cpu_model", "device", "device_name") or "")


def hardware_row(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The `hardware` table row for a fingerprint (columns pulled out for people reading the DB)."""
    fp = dict(fingerprint)
    cores = _first(fp, "cores", "cpu_count", "ncpu")
    compiler = _first(fp, "compiler", "cc", "compilers", "toolchains")
    return {
        "id": fingerprint_id(fp),
        "arch": str(_first(fp, "arch", "machine", "platform") or ""),
        "model": _model(fp),
        "simd": _simd(fp),
        "cores": int(cores) if isinstance(cores, (int, float, str)) and str(cores).isdigit() else None,
        "compiler": compiler if isinstance(compiler, str) else canonical(compiler) if compiler else "",
        "label": hardware_label(fp),
        "fingerprint": canonical(fp),
    }


def hardware_label(fingerprint: Mapping[str, Any]) -> str:
    """A few words naming the machine in a lesson, e.g. 'AMD EPYC 7B13 avx2'."""
    fp = dict(fingerprint)
    if fp.get("label"):
        return str(fp["label"])
    model = " ".join(w for w in _model(fp).replace("(R)", "").replace("(TM)", "").split() if w != "Processor")
    # the host's SIMD level says nothing about kernels that run on an accelerator
    best = "" if _accelerator(fp) else level_of({**fp, "simd": _simd(fp).lower().split()})
    words = [w for w in (model[:40], best) if w]
    return " ".join(words) or str(_first(fp, "arch", "machine") or "unknown hardware")


def operator_relation(operator: str, family: str, other_operator: str, other_family: str) -> str:
    """How another operator relates to this one: "operator" (the same), "family" or "other"."""
    if operator == other_operator:
        return "operator"
    if family and family == other_family:
        return "family"
    return "other"


def hardware_relation(hardware_id: str, arch: str, other_id: str, other_arch: str) -> str:
    """How other hardware relates to this one: "hardware" (the same), "arch" or "other"."""
    if hardware_id == other_id:
        return "hardware"
    if arch and arch == other_arch:
        return "arch"
    return "other"


def structure_sql(table: str, arch: str | None = None) -> str:
    """SQL weighting a row of `table` (columns operator, family, hardware_id, toolchain; arch, or the
    expression given) by its closeness to the parameters :operator, :family, :hardware_id, :arch,
    :toolchain."""
    o, h, t = OPERATOR_WEIGHT, HARDWARE_WEIGHT, TOOLCHAIN_WEIGHT
    arch = arch or f"{table}.arch"
    return (
        f"(CASE WHEN {table}.operator = :operator THEN {o['operator']}"
        f" WHEN {table}.family = :family AND :family != '' THEN {o['family']} ELSE {o['other']} END)"
        f" * (CASE WHEN {table}.hardware_id = :hardware_id THEN {h['hardware']}"
        f" WHEN {arch} = :arch AND :arch != '' THEN {h['arch']} ELSE {h['other']} END)"
        f" * (CASE WHEN {table}.toolchain = :toolchain THEN {t['same']} ELSE {t['other']} END)"
    )
