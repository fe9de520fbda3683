#!/usr/bin/env bash
# GPU check of the Triton toolchain on an NVIDIA machine (torch + triton preinstalled; installs nothing).
#
#   bash bench/gpu_check.sh   # at most ~7.5 min: tests <= 120 s, optimize <= 330 s (KOPE_GPU_TEST_S, KOPE_GPU_OPTIMIZE_S)
#   KOPE_GPU_BUDGET=1 KOPE_GPU_OUT=/tmp/x bash bench/gpu_check.sh   # the smallest run, JSON elsewhere
#
# 1. runs sample_ops_triton's tests on the GPU (correctness + kope_bench timings),
# 2. runs a short `pytest --kope-optimize --kope-agent tuner --kope-budget 8 --kope-no-commit` on a
#    throw-away git copy of sample_ops_triton,
# 3. prints a table per operator (tests passed/failed, test seconds, baseline/best kernel time, speedup)
#    and writes it as JSON to bench/results/gpu_check.json (or to the folder KOPE_GPU_OUT names).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
out="${KOPE_GPU_OUT:-$repo/bench/results}"  # where gpu_check.json goes
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
py="${PYTHON:-python3}"
test_budget_s="${KOPE_GPU_TEST_S:-120}"
optimize_budget_s="${KOPE_GPU_OPTIMIZE_S:-330}"
budget="${KOPE_GPU_BUDGET:-8}"  # evaluations per operator (1: the smallest run)

KOPE_GPU_CHECK_ALLOW_CPU="${KOPE_GPU_CHECK_ALLOW_CPU:-0}" "$py" - <<'PY'
import os
import sys
try:
    import torch
    import triton
except ImportError as e:
    sys.exit(f"gpu_check: needs torch and triton preinstalled ({e})")
if not torch.cuda.is_available():
    if os.environ["KOPE_GPU_CHECK_ALLOW_CPU"] != "1":  # 1: dry run of this script on a CPU (interpreter)
        sys.exit("gpu_check: no CUDA device visible to torch")
    print(f"gpu_check: dry run on CPU, torch {torch.__version__}, triton {triton.__version__}")
else:
    print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}")
PY

# Use the installed plugin, else this checkout (without installing it).
plugin=()
if ! "$py" -c 'import importlib.metadata as m; m.version("pytest-kope")' 2>/dev/null; then
  export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
  plugin=(-p pytest_kope.plugin)
fi
[ "${KOPE_GPU_CHECK_ALLOW_CPU:-0}" = 1 ] || unset TRITON_INTERPRET

cp -r "$repo/sample_ops_triton" "$work/ops"
rm -rf "$work/ops/.kope"
git -C "$work/ops" init -q
git -C "$work/ops" add -A
git -C "$work/ops" -c user.name=kope -c user.email=kope@localhost commit -qm "sample_ops_triton"

echo "== tests (limit ${test_budget_s}s)"
set +e
(cd "$work/ops" && timeout "$test_budget_s" "$py" -m pytest "${plugin[@]}" -q -p no:cacheprovider \
  --junitxml="$work/tests.xml")
tests_rc=$?
echo "== optimize (tuner, budget ${budget}, limit ${optimize_budget_s}s)"
(cd "$work/ops" && timeout "$optimize_budget_s" "$py" -m pytest "${plugin[@]}" -q -p no:cacheprovider \
  --kope-optimize --kope-agent tuner --kope-budget "$budget" --kope-no-commit --kope-report "$work/kope.json")
optimize_rc=$?
set -e

"$py" - "$work/tests.xml" "$work/kope.json" "$out/gpu_check.json" "$tests_rc" "$optimize_rc" <<'PY'
import json
import os
import sys
import xml.etree.ElementTree as ET

tests_xml, kope_json, out_json, tests_rc, optimize_rc = sys.argv[1:]
ops: dict[str, dict] = {}
if os.path.exists(tests_xml):
    for case in ET.parse(tests_xml).iter("testcase"):
        op = case.get("classname", "").split(".")[0]
        row = ops.setdefault(op, {"op": op, "passed": 0, "failed": 0, "skipped": 0, "test_s": 0.0})
        row["test_s"] += float(case.get("time") or 0)
        kinds = {child.tag for child in case}
        key = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        row[key] += 1
report = json.load(open(kope_json)) if os.path.exists(kope_json) else {"operators": []}
for entry in report.get("operators", []):
    row = ops.setdefault(entry["name"], {"op": entry["name"], "passed": 0, "failed": 0, "skipped": 0, "test_s": 0.0})
    row.update(baseline_s=entry.get("baseline_s"), best_s=entry.get("best_s"), speedup=entry.get("speedup"),
               evaluations=entry.get("evaluations"), verified=entry.get("verified"), note=entry.get("note") or "")


def ms(x):
    return f"{x * 1e3:.3f}" if isinstance(x, (int, float)) else "-"


head = f"{'op':<10} {'pass':>4} {'fail':>4} {'skip':>4} {'tests s':>8} {'base ms':>9} {'best ms':>9} {'speedup':>7} {'evals':>5}"
print(head)
print("-" * len(head))
for op in sorted(ops):
    r = ops[op]
    sp = f"{r['speedup']:.2f}x" if isinstance(r.get("speedup"), (int, float)) else "-"
    print(f"{op:<10} {r['passed']:>4} {r['failed']:>4} {r['skipped']:>4} {r['test_s']:>8.1f} "
          f"{ms(r.get('baseline_s')):>9} {ms(r.get('best_s')):>9} {sp:>7} {r.get('evaluations', '-')!s:>5}")
print(f"tests exit {tests_rc}, optimize exit {optimize_rc} (124: hit the time limit); "
      f"hardware: {report.get('hardware_name', '?')}")
json.dump({"tests_rc": int(tests_rc), "optimize_rc": int(optimize_rc), "hardware": report.get("hardware"),
           "operators": list(ops.values())}, open(out_json, "w"), indent=1)
PY
echo "gpu_check: wrote $out/gpu_check.json"
[ "$tests_rc" -eq 0 ] && [ "$optimize_rc" -eq 0 ]
