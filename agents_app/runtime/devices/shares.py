"""Fractions of a GPU, enforced by HAMi-core (docs/devices.md says why this and not MPS).

HAMi-core is a library loaded into every process of the container (/etc/ld.so.preload)
that intercepts CUDA's driver API: an allocation beyond the device memory limit fails, and
kernel launches are throttled to the compute share. It reads its limits from the
environment; its shared cache file (one per container) accounts the memory of all the
container's processes together. Its lock directory stays the container's own: shared by
the host's containers, as HAMi's device plugin has it, it would be a place where kernels of
different owners write to each other. This module says what a share needs of the
container; the CUDA plugin and the mock plugin both pass it on as it is.
"""

import os
from decimal import Decimal

from agents_app.runtime.devices import ContainerArgs

LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"
SHARED_CACHE = "/tmp/vgpu/cudevshr.cache"
ELF_MAGIC = b"\x7fELF"


class HamiCore:
    def __init__(self, library, preload_dir):
        self.library, self.preload_dir = library, preload_dir

    def problem(self):
        """Why shares cannot be enforced here (None: they can)."""
        if not os.path.isfile(self.library):
            return f"HAMi-core's library is not at {self.library} (DEVICE_SHARE_LIBRARY)"
        return None

    def is_library(self):
        with open(self.library, "rb") as library:
            return library.read(4) == ELF_MAGIC

    def preload_list(self):
        """The file mounted as the container's /etc/ld.so.preload, made once."""
        os.makedirs(self.preload_dir, exist_ok=True)
        path = os.path.join(self.preload_dir, "ld.so.preload")
        if not os.path.exists(path):
            with open(path, "w") as preload:
                preload.write(LIBRARY_IN_CONTAINER + "\n")
        return path

    def container_args(self, parts):
        """The environment and mounts for shares: `parts` is [(fraction, device memory in
        bytes)] in the container's device order. Each device's memory limit is its
        fraction of the device's memory; the compute limit (one for all, as HAMi-core
        has it) is the largest fraction."""
        environment = {f"CUDA_DEVICE_MEMORY_LIMIT_{n}": f"{int(fraction * memory) // 2**20}m"
                       for n, (fraction, memory) in enumerate(parts)}
        environment["CUDA_DEVICE_SM_LIMIT"] = str(int(max(f for f, _ in parts) * 100))
        environment["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = SHARED_CACHE
        mounts = {self.library: {"bind": LIBRARY_IN_CONTAINER, "mode": "ro"}}
        # A file that is not a library (the mock plugin's stand-in) in ld.so.preload would
        # make every dynamically linked program in the container complain.
        if self.is_library():
            mounts[self.preload_list()] = {"bind": PRELOAD_IN_CONTAINER, "mode": "ro"}
        return ContainerArgs(environment=environment, mounts=mounts)


def share_parts(allocation, devices):
    """[(fraction, memory)] of a cuda.shares allocation, in device order."""
    return [(Decimal(str(amount)), devices[device_id].memory)
            for device_id, amount in allocation.items()]
