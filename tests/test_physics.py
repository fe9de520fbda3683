"""Physics bounds: cache sizes from recorded sysfs trees and lscpu text, the measured ceilings of this
machine (a real gcc build and run of the probe), the check, the graph round trip and `kope graph stats`."""

from __future__ import annotations

import os

import pytest

from pytest_kope.judge.caches import (
    FALLBACK_CACHES,
    cache_sizes,
    last_level_cache_bytes,
    llc_instances,
    parse_lscpu,
    parse_sysfs,
)

K, M = 1 << 10, 1 << 20
HW = {"arch": "x86_64", "model": "Test CPU 9000", "simd": ["avx2", "fma"], "cores": 2}


def sysfs(root, *caches, shared="0-1"):
    """Write a cpu0 cache tree like /sys/devices/system/cpu: one (level, type, size) per index."""
    for i, (level, kind, size) in enumerate(caches):
        index = root / "cpu0" / "cache" / f"index{i}"
        index.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (index / name).write_text(f"{value}\n")
    return root


ZEN3 = [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "512K"), (3, "Unified", "32768K")]
INTEL = [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1280K"), (3, "Unified", "30720K")]
NO_L3 = [(1, "Data", "32K"), (1, "Instruction", "48K"), (2, "Unified", "2048K")]

# util-linux 2.38.1 `lscpu -B` on this project's EPYC VM (totals over instances, in bytes)
LSCPU_B_238 = """Architecture:                            x86_64
Model name:                              AMD EPYC
L1d cache:                               65536 (2 instances)
L1i cache:                               65536 (2 instances)
L2 cache:                                2097152 (2 instances)
L3 cache:                                33554432 (1 instance)
NUMA node(s):                            1
"""
# util-linux 2.38 plain `lscpu`: human units, still totals
LSCPU_238 = """L1d cache:                       1.1 MiB (24 instances)
L1i cache:                       768 KiB (24 instances)
L2 cache:                        30 MiB (24 instances)
L3 cache:                        60 MiB (2 instances)
"""
# util-linux 2.32 (CentOS 8 era): per-core sizes with K suffixes
LSCPU_232 = """CPU(s):              40
L1d cache:           32K
L1i cache:           32K
L2 cache:            1024K
L3 cache:            28160K
"""
# util-linux 2.39+: a "Caches (sum of all)" section with short names
LSCPU_239 = """Caches (sum of all):
  L1d:                   512 KiB (16 instances)
  L1i:                   512 KiB (16 instances)
  L2:                    16 MiB (16 instances)
  L3:                    64 MiB (2 instances)
"""


@pytest.mark.parametrize(
    "tree, expected",
    [
        (ZEN3, {"L1d": 32 * K, "L2": 512 * K, "L3": 32 * M}),
        (INTEL, {"L1d": 48 * K, "L2": 1280 * K, "L3": 30 * M}),
        (NO_L3, {"L1d": 32 * K, "L2": 2 * M}),
    ],
    ids=["zen3", "intel", "no-l3"],
)
def test_sysfs_trees_give_per_core_data_and_unified_caches(tmp_path, tree, expected):
    root = sysfs(tmp_path, *tree)
    assert parse_sysfs(root) == expected
    assert cache_sizes(root, lscpu="", sysconf={}) == expected
    assert last_level_cache_bytes(expected) == max(expected.values())


def test_an_empty_or_l1_only_tree_falls_through_to_lscpu_then_sysconf_then_the_generous_guess(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cache_sizes(empty, lscpu=LSCPU_232, sysconf={}) == {"L1d": 32 * K, "L2": M, "L3": 28160 * K}
    l1_only = sysfs(tmp_path / "l1", (1, "Data", "32K"), (1, "Instruction", "32K"))
    assert cache_sizes(l1_only, lscpu=LSCPU_B_238, sysconf={})["L3"] == 32 * M
    sysconf = {"SC_LEVEL1_DCACHE_SIZE": 32768, "SC_LEVEL2_CACHE_SIZE": 524288, "SC_LEVEL3_CACHE_SIZE": 0}
    assert cache_sizes(empty, lscpu="", sysconf=sysconf) == {"L1d": 32 * K, "L2": 512 * K}
    assert cache_sizes(empty, lscpu="garbage\n", sysconf={}) == FALLBACK_CACHES
    assert last_level_cache_bytes(FALLBACK_CACHES) >= 256 * M  # rotation sized from it overflows any L3


@pytest.mark.parametrize(
    "text, expected",
    [
        (LSCPU_B_238, {"L1d": 32 * K, "L2": M, "L3": 32 * M}),
        (LSCPU_238, {"L1d": int(1.1 * M) // 24, "L2": 30 * M // 24, "L3": 30 * M}),
        (LSCPU_232, {"L1d": 32 * K, "L2": M, "L3": 28160 * K}),
        (LSCPU_239, {"L1d": 32 * K, "L2": M, "L3": 32 * M}),
        ("", {}),
    ],
    ids=["2.38-B", "2.38", "2.32", "2.39", "none"],
)
def test_recorded_lscpu_outputs(text, expected):
    assert parse_lscpu(text) == expected


def test_llc_instances_counts_the_last_level_caches_this_process_spreads_over(tmp_path):
    root = sysfs(tmp_path, *ZEN3, shared="0")  # an L3 per CPU: one per CPU this process may use
    assert llc_instances(root) == len(os.sched_getaffinity(0))
    assert llc_instances(tmp_path / "none") == 1
