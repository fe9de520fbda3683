"""The hardware label and fingerprint, from recorded /proc/cpuinfo samples (tests/data/cpuinfo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kope import hardware
from pytest_kope.hardware import describe, fingerprint_id, label, make_fingerprint, parse_cpuinfo
from pytest_kope.memory.graph import Graph
from pytest_kope.memory.scope import hardware_label

SAMPLES = Path(__file__).parent / "data" / "cpuinfo"
CACHES = {"L1d": 32 << 10, "L2": 1 << 20, "L3": 32 << 20}


@pytest.mark.parametrize(
    "sample, arch, model, level",
    [
        ("zen3_ryzen_avx2.txt", "x86_64", "AMD Ryzen 9 5950X 16-Core Processor", "avx2"),
        ("zen4_epyc_avx512_kvm.txt", "x86_64", "AMD EPYC", "avx512"),
        ("intel_icelake_avx512.txt", "x86_64", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "avx512"),
        ("graviton3_neoverse_v1_sve.txt", "aarch64", "Neoverse-V1", "sve"),
        ("graviton2_neoverse_n1_neon.txt", "aarch64", "Neoverse-N1", "neon"),
    ],
)
def test_the_label_names_the_simd_level_the_machine_has(sample, arch, model, level) -> None:
    fp = make_fingerprint((SAMPLES / sample).read_text(), arch, 8, CACHES)
    assert fp["model"] == model and fp["simd_level"] == level
    assert describe(fp) == f"{model} ({arch}, {level}, 8 cores)"
    assert label(fp) == f"{model} ({arch}, {level}, 8 cores, L2 1 MiB, L3 32 MiB)"
    assert hardware_label(fp).endswith(f" {level}")
    if level != "avx512":  # an AVX2 machine is never called an AVX-512 one, nor the other way round
        assert not any(f.startswith("avx512") for f in fp["simd"])


def test_a_kernel_on_an_accelerator_is_labelled_by_the_accelerator_not_the_host() -> None:
    """Seen on an H200 machine: a Triton kernel's lessons read "Intel Xeon avx512", so recall would
    have treated them as the host CPU's, beside C kernels that really ran there."""
    from pytest_kope.memory.scope import hardware_row

    host = make_fingerprint((SAMPLES / "intel_icelake_avx512.txt").read_text(), "x86_64", 16, CACHES)
    gpu = {**host, "toolchain": "triton", "mode": "cuda", "device": "NVIDIA H200", "capability": "9.0"}
    assert hardware_label(gpu) == "NVIDIA H200" and hardware_row(gpu)["model"] == "NVIDIA H200"
    interpreter = {**host, "toolchain": "triton", "device": "cpu (triton interpreter)"}
    assert hardware_label(interpreter) == hardware_label(host)  # on the CPU, the CPU it is
    assert hardware_label(host).startswith("Intel Xeon Platinum 8375C")


def test_older_levels_and_unknown_arm_parts() -> None:
    assert hardware.simd_level(["sse", "sse2", "pni", "ssse3", "sse4_1", "sse4_2"]) == "sse4_2"
    assert hardware.simd_level(["sse", "sse2", "pni"]) == "sse3"
    assert hardware.simd_level(["fp", "asimd", "sve", "sve2"]) == "sve2"
    assert hardware.simd_level(["fp"]) == ""
    arm = "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x48\nCPU part\t: 0xd01\n"
    assert parse_cpuinfo(arm)["model"] == "ARM implementer 0x48 part 0xd01"


def test_measured_bandwidth_joins_the_label_never_the_fingerprint() -> None:
    fp = make_fingerprint((SAMPLES / "zen4_epyc_avx512_kvm.txt").read_text(), "x86_64", 2, CACHES)
    ceilings = {"sizes": [16 << 10, 128 << 20], "read": [300.0, 11.64], "write": [1, 1], "copy": [1, 1]}
    assert label(fp, ceilings).endswith(", L3 32 MiB, 11.6 GB/s memory)")
    assert label(fp, None) == label(fp, {"sizes": []})  # unknown bandwidth: left out
    assert not any("bandwidth" in k or "gb" in k.lower() for k in fp)


def test_fingerprints_stay_comparable_across_runs_on_one_machine(tmp_path: Path) -> None:
    text = (SAMPLES / "zen4_epyc_avx512_kvm.txt").read_text()
    first = make_fingerprint(text, "x86_64", 2, CACHES)
    # the cache sizes came from another source this time (lscpu rounds, or none could be read)
    again = make_fingerprint(text, "x86_64", 2, {"L2": 1 << 20, "L3": 32 << 20})
    bare = make_fingerprint(text, "x86_64", 2)
    assert fingerprint_id(first) == fingerprint_id(again) == fingerprint_id(bare)
    # the identity is what it was before the level and the caches were added: old graphs still match
    old = {k: first[k] for k in ("arch", "model", "simd", "cores")}
    assert fingerprint_id(old) == fingerprint_id(first)
    # what names another machine still does: other flags, other cores
    zen3 = make_fingerprint((SAMPLES / "zen3_ryzen_avx2.txt").read_text(), "x86_64", 2, CACHES)
    assert fingerprint_id(zen3) != fingerprint_id(first)
    assert fingerprint_id({**first, "cores": 4}) != fingerprint_id(first)
    with Graph(tmp_path / "g.db") as graph:
        assert graph.hardware_id(first) == graph.hardware_id(again) == fingerprint_id(first)


def test_this_machine_has_a_level_and_its_fingerprint_is_stable() -> None:
    fp = hardware.cpu_fingerprint()
    hardware.cpu_fingerprint.cache_clear()
    assert fingerprint_id(hardware.cpu_fingerprint()) == fingerprint_id(fp)
    if fp["arch"] in ("x86_64", "aarch64"):
        assert fp["simd_level"] and fp["simd_level"] in describe(fp)


WIDE_SUM = """// kope: kernel void wide(const float *x, float *y, int n)
typedef float v16 __attribute__((vector_size(64)));
void wide(const float *x, float *y, int n) {
    v16 s = {0};
    for (int i = 0; i + 16 <= n; i += 16) {
        v16 v;
        __builtin_memcpy(&v, x + i, sizeof v);
        s += v;
    }
    __builtin_memcpy(y, &s, sizeof s);
}
"""


def test_target_flags_tune_for_a_narrower_machine_as_another_hardware_kind(tmp_path, monkeypatch) -> None:
    """kope_c_target_flags / $KOPE_C_TARGET_FLAGS come after every candidate's own flags, so an AVX-512
    build machine tunes for an AVX2 fleet; the graph keeps what it learns apart, and the label says so."""
    import shutil
    import subprocess

    from pytest_kope.candidate import Candidate
    from pytest_kope.errors import ConfigError
    from pytest_kope.spec import parse_spec
    from pytest_kope.toolchains.c import TARGET_ENV, CToolchain

    monkeypatch.delenv(TARGET_ENV, raising=False)
    plain, narrow = CToolchain(), CToolchain(target_flags="-mno-avx512f")
    candidate = Candidate(WIDE_SUM, "wide.c", "c", params={"flags": "-O3 -march=native"})
    command = narrow.command(candidate, Path("wide.c"), Path("wide.so"))
    assert command.index("-mno-avx512f") > command.index("-march=native")
    assert plain.build_key(candidate, None) != narrow.build_key(candidate, None)
    assert fingerprint_id(plain.fingerprint()) != fingerprint_id(narrow.fingerprint())
    assert describe(narrow.fingerprint()).endswith("built with -mno-avx512f)")
    assert narrow.environment()[TARGET_ENV] == "-mno-avx512f"
    monkeypatch.setenv(TARGET_ENV, "-mno-avx512f")  # what a judging child gets
    assert CToolchain().target_flags == ("-mno-avx512f",)
    with pytest.raises(ConfigError, match=TARGET_ENV):
        CToolchain(target_flags="-o /tmp/elsewhere")
    if "avx512f" not in hardware.cpu_fingerprint().get("simd", []) or not shutil.which("objdump"):
        return  # no AVX-512 here to turn off: the flag's effect is not observable
    spec = parse_spec(WIDE_SUM, "wide.c")
    zmm = {}
    for name, tc in (("plain", plain), ("narrow", narrow)):
        lib = tc.compile(candidate, spec, tmp_path / name)[0]
        zmm[name] = (
            "%zmm" in subprocess.run(["objdump", "-d", str(lib)], capture_output=True, text=True).stdout
        )
    assert zmm == {"plain": True, "narrow": False}
