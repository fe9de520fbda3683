"""Technique tags: what a new kernel source *does*, so a lesson about it applies beyond its exact words.

An LLM's idea text ("one pass with an online max and a vectorized exp") almost never repeats, so a
lesson keyed by it almost never applies again. The tags are read from the lines the candidate added
against its parent (the diff) and from its idea, by fixed patterns; a lesson is keyed by tag, family
and hardware, and keeps the idea texts as its evidence.
"""

from __future__ import annotations

import difflib
import re

# tag -> patterns over the added source lines and the idea (case-insensitive)
TAGS: dict[str, tuple[str, ...]] = {
    "vectorized-exp": (
        r"fast[_ ]?(exp|tanh)",
        r"(vectori[sz]ed|inline|polynomial|approximat\w*)\s+(exp|tanh)",
        r"exp(f)?\s+(polynomial|approximation)",
        r"\bexp2f?\b",
        r"ldexpf?",
    ),
    "simd": (r"#\s*pragma\s+omp\s+simd", r"vector_size", r"_mm(256|512)?_", r"\bsimd\b", r"vectori[sz]"),
    "row-blocking": (r"row[- ]block", r"rows? at a time", r"\bROWS\b", r"several rows", r"block of rows"),
    "register-tiling": (r"register[- ]til", r"micro[- ]?kernel", r"\bMR\b", r"\bNR\b"),
    "multiple-accumulators": (r"accumulators", r"partial sums", r"independent (sums|chains)"),
    "fused-passes": (
        r"\bfus(e|ed|es|ing)\b",
        r"one[- ]pass",
        r"single[- ]pass",
        r"online (softmax|max)",
        r"welford",
    ),
    "threads": (r"omp\s+parallel", r"pthread", r"\bTHREADS\b", r"multi-?thread", r"\bthreads?\b"),
    "unrolling": (r"unroll",),
    "non-temporal-stores": (r"non[- ]?temporal", r"_stream_(ps|si)", r"nontemporal", r"streaming stores?"),
    "cache-blocking": (r"\btil(e|ed|ing)\b", r"cache[- ]block", r"\bBLOCK\b", r"\bblock(ed|ing)\b"),
    "packing": (r"\bpack(ed|ing|s)?\b",),
    "prefetch": (r"prefetch",),
    "fast-math-flags": (r"-ffast-math", r"-fno-math-errno", r"-Ofast", r"-funsafe-math"),
    "alignment": (r"aligned", r"assume_aligned", r"alignas"),
}
_COMPILED = {tag: [re.compile(p, re.IGNORECASE) for p in pats] for tag, pats in TAGS.items()}


def added_lines(parent: str, child: str) -> str:
    """The lines `child` adds against `parent` (all of `child` when there is no parent)."""
    if not parent:
        return child
    diff = difflib.unified_diff(parent.splitlines(), child.splitlines(), lineterm="", n=0)
    return "\n".join(line[1:] for line in diff if line.startswith("+") and not line.startswith("+++"))


def technique_tags(idea: str, parent_source: str = "", source: str = "") -> list[str]:
    """The techniques an attempt applies, from its idea and the lines it added, in TAGS order."""
    text = idea + "\n" + added_lines(parent_source, source) if source else idea
    return [tag for tag, patterns in _COMPILED.items() if any(p.search(text) for p in patterns)]
