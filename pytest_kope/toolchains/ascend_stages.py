"""The two programs of the Ascend lowering check, each a child process of its own (`ascend_lowering`).

``python -m pytest_kope.toolchains.ascend_stages frontend DIR`` compiles one launch of a kernel in
``DIR/<module file>`` (described in ``DIR/request.json``) through triton-ascend's front end to TTIR,
``DIR/kernel.ttir``. It is the only step that runs the kernel's module, so it does so after triton
and the Ascend backend are imported and the kernel server's seccomp filter is on: no new process,
no socket. Its word is not the verdict: a forged TTIR still has to pass the next program.

``... linalg DIR`` runs triton-ascend's own pipeline on that TTIR text (``triton.compile`` on the
file: ``triton-adapter-opt`` to Linalg, then CANN's ``bishengir-compile`` where CANN is), in a
process that loads no kernel code, so what it says can be believed. Each prints one JSON line.

Both need ``TRITON_INTERPRET=0`` (triton reads it once, when it is imported), so neither can run in
a process that interprets kernels.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

FP64_RULE = "[fp8, fp64] is unsupported on Ascend for now"  # triton-ascend 3.2, language/semantic.py
_PAST_LINALG = "ConvertLinalgRToBinary"  # triton-ascend's name for the stage after Linalg (CANN's)


def frontend(folder: Path) -> dict[str, Any]:
    """Python -> TTIR for the launch in `folder`/request.json; the TTIR goes to `folder`/kernel.ttir."""
    request = json.loads((folder / "request.json").read_text())
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    target = GPUTarget("npu", request["target"], 0)
    backend = make_backend(target)
    options = backend.parse_options(dict(request["options"]))
    from ..judge.kernel import seccomp

    unfiltered = seccomp.no_escape(os.getpid())  # before any of the kernel's module runs
    module = _load(folder / request["file"])
    fn = _kernel(module, request["kernel"])
    values = [_value(kind, spec, constant) for kind, spec, constant in _arguments(fn, request)]
    attrs = backend.get_attrs_descriptor(fn.params, values)
    folded = attrs.get_constants()
    constants = {
        p.name: v for v, p in zip(values, fn.params) if p.is_constexpr or p.num in folded or v is None
    }
    signature = {name: kind for name, kind, _ in request["args"]}
    source = ASTSource(fn, signature, constants, attrs)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    mod = source.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options)
    ttir = str(stages["ttir"](mod, {"target": target, **options.__dict__}))
    (folder / "kernel.ttir").write_text(ttir)
    return {"stage": "ttir", "note": unfiltered}


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"kope_lowered_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _kernel(module: Any, name: str) -> Any:
    """The @triton.jit function called `name` at the module's top level, unwrapped from heuristics,
    autotune or any other wrapper that keeps it as `.fn`."""
    for value in list(vars(module).values()):
        while not hasattr(value, "params") and hasattr(value, "fn"):
            value = value.fn
        if hasattr(value, "params") and getattr(value, "__name__", "") == name:
            return value
    raise LookupError(f"no @triton.jit kernel {name} at the top level of the module: define it there")


def _arguments(fn: Any, request: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(type, specialisation, constant) per parameter of `fn`, in order."""
    runtime = {name: (kind, spec) for name, kind, spec in request["args"]}
    constants = dict(request["constants"])
    return [(*runtime.get(p.name, ("constexpr", "")), constants.get(p.name)) for p in fn.params]


class _Pointer:
    """A tensor as Triton's specialisation sees it: its address's alignment, nothing else."""

    def __init__(self, aligned: bool):
        self.aligned = aligned

    def data_ptr(self) -> int:
        return 0 if self.aligned else 8


def _value(kind: str, spec: str, constant: Any) -> Any:
    """A value that Triton specialises as the launch's argument was."""
    if kind == "constexpr":
        if isinstance(constant, str) and constant.startswith("tl."):
            import triton.language as tl

            return getattr(tl, constant[3:])
        return constant
    if kind.startswith("*"):
        return _Pointer(spec == "16")
    if kind == "none":
        return None
    if kind == "i1":
        return True
    if kind.startswith(("i", "u")):
        base = {"i32": 0, "i64": 2**32, "u64": 2**63}.get(kind, 0)
        return 1 if spec == "1" else base + 16 if spec == "16" else base + 17
    return 1.5


def linalg(folder: Path) -> dict[str, Any]:
    """TTIR -> Linalg (and on, where CANN is) by triton-ascend's own pipeline; then the rules."""
    request = json.loads((folder / "request.json").read_text())
    import triton
    from triton.backends.compiler import GPUTarget

    ttir = folder / "kernel.ttir"
    text = ttir.read_text()
    options = dict(request["options"])
    if not options.get("compile_on_910_95") and re.search(r"\bf64\b", text):
        return {
            "fail": "ttir",
            "error": f"fp64 values in the kernel: {FP64_RULE} (triton-ascend's rule for casts, on the TTIR)",
        }
    try:
        triton.compile(str(ttir), target=GPUTarget("npu", request["target"], 0), options=options)
        stage = "npubin"
    except Exception as e:  # noqa: BLE001 - triton-ascend's failure, reported as data
        stage_name = getattr(e, "stage_name", None) or type(e).__name__
        if stage_name != _PAST_LINALG:
            return {"fail": stage_name, "error": first_error(str(e))}
        stage = "linalg"
    adapted = sorted(folder.rglob("*.ttadapter"))
    if stage == "linalg" and not adapted:
        return {"fail": "ConvertTritonIRToLinalgIR", "error": "triton-adapter-opt wrote no Linalg"}
    if adapted and "llvm.inline_asm" in adapted[0].read_text():
        return {
            "fail": "linalg",
            "error": "inline assembly (tl.inline_asm_elementwise) has no Ascend lowering",
        }
    return {"stage": stage}


def first_error(text: str) -> str:
    """The first line of a compiler's output that says what is wrong, without paths to temp files."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    keep = [line for line in lines if not line.startswith(("///", "[INFO]", "PLEASE", "Stack dump", "#"))]
    for line in keep:
        if "Assertion" in line:  # a crashed tool: its assertion, not the path of its build machine
            tool = line.split(":", 1)[0] if ":" in line else "the compiler"
            return f"{tool} crashed: {line[line.index('Assertion') :]}"[:400]
        if re.search(r"error|failed|unsupported|Error", line) and "encounters error" not in line:
            return re.sub(r"/tmp/\S+", "<tmp>", line)[:400]
    return (keep[0] if keep else "no message")[:400]


def _exception(e: BaseException) -> str:
    """One line for a failed step: Triton's "at LINE:COL:" of the kernel and the cause it gives last."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("at "):
        return f"{lines[0]} {lines[-1]}"[:400]
    return first_error(f"{type(e).__name__}: {e}")


def main(argv: list[str]) -> int:
    """``frontend DIR`` or ``linalg DIR``: print the stage's JSON answer as the last line."""
    stage, folder = argv[1], Path(argv[2])
    try:
        answer = frontend(folder) if stage == "frontend" else linalg(folder)
    except Exception as e:  # noqa: BLE001 - the kernel's compile error, reported as data
        answer = {"fail": stage, "error": _exception(e)}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
