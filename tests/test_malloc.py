"""common/malloc.py: after tuning, a transfer-sized block comes from the heap and is
reused, instead of a fresh mmap for every chunk. Each case runs in a fresh interpreter,
since the settings are the process's own."""

import subprocess
import sys

from django.conf import settings

# In a fresh process: how many mmapped blocks glibc holds while a 4 MiB bytes object
# lives, before and after tune_for_transfers().
PROBE = """
import ctypes, ctypes.util
from common import malloc

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2

def mmapped_while_held(size=4 << 20):
    before = libc.mallinfo2().hblks
    block = bytes(size)
    held = libc.mallinfo2().hblks
    del block
    return held - before

default = mmapped_while_held()
tuned = malloc.tune_for_transfers()
print(default, tuned, mmapped_while_held())
"""


def test_a_transfer_sized_block_is_not_a_fresh_mmap_once_tuned():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            cwd=settings.BASE_DIR, check=True)
    default, tuned, after = result.stdout.split()
    assert default == "1"  # the default: a 4 MiB block is an mmap of its own
    assert tuned == "True"
    assert after == "0"  # tuned: it comes from the heap
