"""Mock CUDA devices, for everything that does not need a GPU to be shown.

`run_agent --mock-devices N` offers N devices under the CUDA plugin's slot names. Each is
a real character device made for it on the host (with /dev/null's numbers, under a name of
its own and of its agent's), attached to the kernel's container with Docker's device
option as the CUDA plugin attaches a GPU with a device request, under the name
/dev/bai-mock<id>, with the same environment variables; fractions get HAMi-core's
environment and mounts (with a stand-in file for its library where the real one is not
installed). A kernel sees exactly the device nodes it holds, and no others.

Its measures say what is allocated: a device held whole is 100 % used, one half-shared 50 %.
"""

import os
import re
import stat
from pathlib import Path

from django.conf import settings

from agents_app.runtime.devices import (
    ContainerArgs,
    Device,
    DevicePlugin,
    DevicePluginError,
    cuda_environment,
)
from agents_app.runtime.devices.shares import HamiCore, share_parts
from common.devices import SHARES

NULL_DEVICE = (1, 3)  # /dev/null's major and minor numbers
MEMORY = 16 * 2**30  # what each mock device says it has


def node_name(agent_id, device_id):
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", agent_id)
    return f"bai-mock-{safe}-{device_id}"


class MockPlugin(DevicePlugin):
    key = "cuda"
    name = "mock"

    def init(self):
        count = int(self.options.get("mock_devices") or 0)
        if count < 1:
            raise DevicePluginError("no mock devices asked for (run_agent --mock-devices N)")
        directory = Path(self.options.get("mock_device_dir") or settings.MOCK_DEVICE_DIR)
        self.devices = []
        for n in range(count):
            path = directory / node_name(self.agent_id, n)
            make_node(path)
            self.devices.append(Device(id=str(n), model="Mock CUDA device", memory=MEMORY,
                                       numa_node=n % 2, path=str(path)))
        library = settings.DEVICE_SHARE_LIBRARY
        self.hami = HamiCore(library if os.path.isfile(library) else stand_in_library(),
                             Path(settings.VAR_DIR) / "devices")

    def list_devices(self):
        return self.devices

    def offers_shares(self):
        return True  # enforced as configuration only: there is no GPU to enforce it on

    def container_args(self, allocation, kernel_id):
        by_id = {d.id: d for d in self.devices}
        held = sorted({d for devices in allocation.values() for d in devices}, key=int)
        args = ContainerArgs(
            devices=[f"{by_id[d].path}:/dev/bai-mock{d}:rwm" for d in held],
            environment=cuda_environment(held, held))
        shares = allocation.get(f"{self.key}{SHARES}")
        if shares:
            args.add(self.hami.container_args(share_parts(
                dict(sorted(shares.items(), key=lambda item: int(item[0]))), by_id)))
        return args

    def measure(self, held):
        return {d.id: {"utilization": float(min(held.get(d.id, 0), 1) * 100),
                       "mem_used": int(min(held.get(d.id, 0), 1) * d.memory),
                       "mem_total": d.memory} for d in self.devices}


def make_node(path):
    """A character device with /dev/null's numbers at `path` (kept when it is one)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*NULL_DEVICE))
        except OSError as exc:
            raise DevicePluginError(f"cannot make the mock device node {path}: {exc.strerror}"
                                    " (the agent makes it as root)") from None
        return
    if not stat.S_ISCHR(info.st_mode) or (os.major(info.st_rdev), os.minor(info.st_rdev)) \
            != NULL_DEVICE:
        raise DevicePluginError(f"{path} exists and is not a mock device node")


def stand_in_library():
    """A file where HAMi-core's library would be, for mock shares on a host without it."""
    path = Path(settings.VAR_DIR) / "devices" / "libvgpu-stand-in.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("a stand-in for HAMi-core's libvgpu.so: mock devices only\n")
    return str(path)
