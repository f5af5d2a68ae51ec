"""glibc's allocator, tuned for a proxy that decodes a ~1 MB body on every turn.

Each agent turn makes a few buffers of 1–4 MB (the body, its decoded text: UCS-4 when a single
emoji is in it) and frees them when the flow is done. glibc serves allocations that size from
`mmap` (or from heap top that it trims back to the system when freed), so every turn's buffers
are fresh pages, and every page faults on first touch (docs/benchmarks.md, "Inside the proxy:
page faults", has the figures). Raising the mmap
threshold (32 MiB) and the trim threshold (64 MiB) keeps those buffers in the heap, reused turn
after turn; the process keeps at most 64 MiB of freed heap top instead of returning it at once.

`mallopt` is glibc's; elsewhere (musl, macOS, Windows) `tune` does nothing and says so. The
addon calls it once at start unless `--set cg_tune_malloc=false`.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's own ceiling for the mmap threshold
TRIM_THRESHOLD = 64 * 1024 * 1024

_done: list[bool] = []


def tune() -> str | None:
    """Set both thresholds once per process; None when set, else why not."""
    if _done:
        return None if _done[0] else "not glibc"
    if not sys.platform.startswith("linux"):
        _done.append(False)
        return f"not glibc ({sys.platform})"
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc has it; musl does not
    except (OSError, AttributeError):
        _done.append(False)
        return "not glibc"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    _done.append(ok)
    return None if ok else "mallopt refused"
