"""Passes over many rows (the scheduler's, idle culling's) hold some 10^5 short-lived, acyclic
objects to their end: the cyclic garbage collector, triggered by the allocation count, would
walk them again and again for nothing (a fifth of a 10,000-session pass, measured for both).
Reference counting still frees what a pass drops; the collector runs again after it."""

import gc
from contextlib import contextmanager


@contextmanager
def collector_paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
