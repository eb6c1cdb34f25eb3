"""Give memory back to the system after large messages (glibc only; elsewhere, nothing).

Measured on real worker processes (RSS, tests/test_worker_hardening.py has the checks):
- each 50 MB message that gRPC refused for its size still left ~10 MiB of freed heap that glibc
  kept in gRPC's per-thread arenas: +200 MiB after 20, never given back (malloc_trim(0) did).
  With one arena, freed chunks coalesce and get reused: +11 MiB after 20, +45 to +48 after 60
  or 150 (gRPC's buffers for the open connection), nothing once the connection closed;
- a long prefill (4092 tokens) or a Verify with 64 dense distributions of 32k tokens frees
  tens of MiB of activations and buffers: after ten of each, +70 and +185 MiB stayed; one
  arena, +51 and +89; one arena and malloc_trim(0) after each large call, +14 and +15.
A worker's threads (the asyncio loop, gRPC's pollers, the model thread) seldom allocate at the
same time, so one arena costs little; malloc_trim(0) takes 3-4 ms on a worker's heap.
"""

import ctypes
import functools
import logging

log = logging.getLogger("tandem.worker")

_M_ARENA_MAX = -8  # glibc's mallopt parameter number


@functools.cache
def _glibc():
    """The C library when it is glibc (mallopt and malloc_trim exist there only), else None."""
    libc = ctypes.CDLL(None)  # this process's symbols, the C library's among them
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "malloc_trim") else None


def one_arena() -> bool:
    """Have every thread allocate from glibc's main arena: call before the worker starts its
    threads (arenas made earlier stay). True when set."""
    libc = _glibc()
    ok = bool(libc and libc.mallopt(_M_ARENA_MAX, 1))
    if not ok:
        log.info("not glibc: malloc arenas left as they are")
    return ok


def trim() -> None:
    """Return the heap's free pages to the system (malloc_trim(0)); a few ms for a worker's heap."""
    libc = _glibc()
    if libc:
        libc.malloc_trim(0)
