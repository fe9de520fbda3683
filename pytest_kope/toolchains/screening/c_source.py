"""C/C++ sources: one comment stripper and one list of forbidden names, a fast first pass run in the
controller (and by the claude agent before it submits). Macros, token pasting and function pointers get
past any name screen, so the built library is checked too (library.py)."""

from __future__ import annotations

import re

# -- C/C++ sources -------------------------------------------------------------------------------------

# Calls a kernel has no business making: process, file, network, environment, dynamic loading, threads.
# A source that names one of them is refused before it is built (README: "Threat model").
FORBIDDEN_CALLS = (
    "system", "popen", "fork", "vfork", "clone", "execl", "execle", "execlp", "execv", "execve", "execvp",
    "execvpe", "fexecve", "posix_spawn", "posix_spawnp", "socket", "connect", "bind", "fopen", "freopen",
    "open", "openat", "creat", "unlink", "unlinkat", "remove", "rename", "rmdir", "mkdir", "getenv",
    "secure_getenv", "setenv", "putenv", "dlopen", "dlsym", "syscall", "ptrace", "kill", "mmap",
    "mprotect", "chdir", "pthread_create", "environ", "__environ",
)  # fmt: skip
# `)`, `,` and `}` catch the name used as a value: `(fork)()`, `{fork, ...}`, `f = (fork);`.
_FORBIDDEN_RE = re.compile(r"\b(" + "|".join(FORBIDDEN_CALLS) + r")\b\s*(\(|;|\[|\)|,|\})")
# A kernel that asks whether it was built sanitized can be right only where it was (the judge's
# sanitized run, `toolchains/sanitize.py`): the names it would ask with.
_SANITIZER_RE = re.compile(
    r"__SANITIZE_\w+__|\b(address|undefined_behavior)_sanitizer\b|\b__(asan|ubsan|sanitizer)_\w*"
)
_ASM_SYSCALL_RE = re.compile(r"\b(__asm__|asm)\b\s*(volatile\s*|__volatile__\s*)?\(\s*\"[^\"]*\bsyscall\b")
# Flags a candidate may choose: optimization, target, code-generation and warning switches. Nothing that
# loads code into the compiler (-fplugin), reads other files (-include, -I, @file, -specs) or links.
_ALLOWED_FLAG = re.compile(
    r"^-(O[0-3sz]?|Ofast|march=[\w.-]+|mtune=[\w.-]+|m[\w-]+(=[\w.,-]+)?|f[\w-]+(=[\w.,-]+)?"
    r"|W[\w-]*(=[\w-]+)?|g\d?|std=[\w+]+|D\w+(=[\w.-]*)?|U\w+|pipe|funroll-loops)$"
)
_DENIED_FLAG = re.compile(  # sanitize: the judge's own sanitized build (`toolchains/sanitize.py`) only
    r"^-f(plugin|profile|auto-profile|debug-prefix-map|file-prefix-map|record|dump|stack-usage|sanitize)"
)
_CHAR_PREFIXES = ("L", "u", "U", "u8")


def strip_c_comments(text: str) -> str:
    """C/C++ source without comments (each replaced by a space), as the compiler reads it.

    Lines ending in a backslash are joined first (so ``sys\\<newline>tem(`` is seen as ``system(``), and
    string, character and C++ raw-string literals are skipped whole, so ``"//"`` hides nothing after it.
    Newlines inside block comments are kept, so line numbers still match.
    """
    text = re.sub(r"\\[ \t]*\r?\n", "", text)
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" ")
            i = end
        elif c == "/" and nxt == "*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(" " + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"' or (c == "'" and _starts_char_literal(text, i)):
            end = _literal_end(text, i)
            out.append(text[i:end])
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _starts_char_literal(text: str, i: int) -> bool:
    """Whether the quote at `i` opens a character literal, not a C++14 digit separator (``1'000``)."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
        j -= 1
    return j == i or text[j:i] in _CHAR_PREFIXES


def _literal_end(text: str, i: int) -> int:
    """Index just past the string or character literal opening at `i` (raw strings included)."""
    quote = text[i]
    raw = re.search(r"(?<![\w])(?:u8|u|U|L)?R$", text[max(0, i - 3) : i])
    if quote == '"' and raw:
        m = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
        if m:
            close = text.find(")" + m.group(1) + '"', i + m.end())
            return len(text) if close < 0 else close + len(m.group(1)) + 2
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        if text[j] == "\n":  # unterminated: the compiler refuses it; stop at the line's end
            return j
        j += 1
    return len(text)


def forbidden_c_names(text: str) -> list[str]:
    """The forbidden names a C/C++ source calls or takes the value of, sorted (comments ignored)."""
    return sorted({m.group(1) for m in _FORBIDDEN_RE.finditer(strip_c_comments(text))})


def screen_c_source(text: str) -> list[str]:
    """Reasons to refuse a C/C++ kernel source before building it (one line each); [] if none."""
    stripped = strip_c_comments(text)
    found = sorted({m.group(1) for m in _FORBIDDEN_RE.finditer(stripped)})
    reasons = [
        f"calls {name}() (process/file/network/environment APIs are not allowed in a kernel)"
        for name in found
    ]
    if _ASM_SYSCALL_RE.search(stripped):
        reasons.append("issues a raw syscall from inline assembly")
    if found_sanitizer := _SANITIZER_RE.search(stripped):
        reasons.append(f"names {found_sanitizer.group(0)} (a kernel may not ask whether it runs sanitized)")
    return reasons


def compiler_flag_ok(flag: str) -> bool:
    """Whether a candidate may pass `flag` to the compiler (optimization, target and warning flags)."""
    return bool(_ALLOWED_FLAG.match(flag)) and not _DENIED_FLAG.match(flag)
