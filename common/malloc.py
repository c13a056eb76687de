"""glibc's allocator tuned for processes that carry bulk bytes (the web process, the
agent's stream endpoint).

Every body chunk, socket read and file read of a transfer is a new `bytes` object of
64 KiB to a few MiB. Above glibc's mmap threshold (128 KiB until the process has freed a
larger mmapped block) each one is a fresh mmap: its pages are faulted in and zeroed,
then unmapped when it is freed, and the freed top of the heap is given back to the system
and faulted in again. Measured on the bare ASGI upload of `make bench BENCH=storage`: a
fresh uvicorn took 1 GiB in 16 MiB parts at 476 MB/s, the same with these settings at
863 MB/s (BENCHMARKS.md, issue 17). Blocks up to MMAP_THRESHOLD are then reused from the
heap, and up to TRIM_THRESHOLD of free heap is kept; what a process holds at once is
still bounded by its flow control.
"""

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt parameters, <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest on 64-bit
TRIM_THRESHOLD = 64 * 1024 * 1024


def tune_for_transfers():
    """Set the thresholds in this process; False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        log.info("no glibc mallopt here: the allocator keeps its defaults")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
