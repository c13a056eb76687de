"""NVIDIA GPUs through NVML (the `nvidia-ml-py` package, imported here only), attached with
Docker's NVIDIA device requests (the NVIDIA Container Toolkit does the rest).

Whole GPUs are `cuda.device`; fractions, `cuda.shares`, only where HAMi-core's library is
installed (DEVICE_SHARE_LIBRARY), which enforces them (devices/shares.py). Each device's
utilization and memory are read from NVML for the heartbeat and the kernels' stats.
"""

import logging
import shutil
from pathlib import Path

from django.conf import settings
from docker.types import DeviceRequest

from agents_app.runtime.devices import (
    ContainerArgs,
    Device,
    DevicePlugin,
    DevicePluginError,
    cuda_environment,
)
from agents_app.runtime.devices.shares import HamiCore, share_parts
from common.devices import SHARES

log = logging.getLogger(__name__)
# What a kernel may use of its GPUs (the NVIDIA Container Toolkit's driver capabilities).
CAPABILITIES = ["gpu", "utility", "compute"]
# Docker's NVIDIA device requests run this hook of the NVIDIA Container Toolkit.
TOOLKIT_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-toolkit")


def nvml():
    """The NVML bindings, initialized; DevicePluginError when there is no GPU to read."""
    try:
        import pynvml  # nvidia-ml-py: only where the CUDA plugin loads
    except ImportError:
        raise DevicePluginError("the nvidia-ml-py package is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise DevicePluginError(f"NVML cannot be initialized: {exc}") from None
    return pynvml


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def numa_node(bus_id):
    """The NUMA node of a PCI device ("00000000:3B:00.0" as NVML gives it), from sysfs."""
    address = text(bus_id).lower()[-12:]  # sysfs names it with a 4-digit domain
    try:
        node = int(Path(f"/sys/bus/pci/devices/{address}/numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


class CUDAPlugin(DevicePlugin):
    key = "cuda"
    name = "cuda"

    def init(self):
        self.nvml = nvml()
        if not any(shutil.which(hook) for hook in TOOLKIT_HOOKS):
            raise DevicePluginError("Docker cannot attach GPUs here: the NVIDIA Container "
                                    "Toolkit is not installed")
        self.devices = self.read_devices()
        if not self.devices:
            raise DevicePluginError("NVML finds no GPU")
        self.hami = HamiCore(settings.DEVICE_SHARE_LIBRARY, Path(settings.VAR_DIR) / "devices")
        problem = self.hami.problem()
        if problem:
            log.info("cuda.shares not offered: %s", problem)
        self.shares = problem is None

    def read_devices(self):
        nv, found = self.nvml, []
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            found.append(Device(
                id=str(index), model=text(nv.nvmlDeviceGetName(handle)),
                memory=int(nv.nvmlDeviceGetMemoryInfo(handle).total),
                numa_node=numa_node(nv.nvmlDeviceGetPciInfo(handle).busId),
                uuid=text(nv.nvmlDeviceGetUUID(handle))))
        return found

    def list_devices(self):
        return self.devices

    def offers_shares(self):
        return self.shares

    def container_args(self, allocation, kernel_id):
        return gpu_args(self.devices, allocation, self.hami if self.shares else None)

    def measure(self, held):
        nv, measures = self.nvml, {}
        for device in self.devices:
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(int(device.id))
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
                measures[device.id] = {
                    "utilization": float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
                    "mem_used": int(memory.used), "mem_total": int(memory.total)}
            except nv.NVMLError as exc:  # one device that does not answer: the others do
                log.debug("NVML: device %s not measured: %s", device.id, exc)
        return measures


def gpu_args(devices, allocation, hami=None):
    """The device request for the GPUs of `allocation` (by UUID: NVML's index and the
    container runtime's order need not agree), the CUDA variables, and for shares
    HAMi-core's environment and mounts."""
    by_id = {d.id: d for d in devices}
    held = sorted({d for part in allocation.values() for d in part}, key=int)
    uuids = [by_id[d].uuid for d in held]
    args = ContainerArgs(
        device_requests=[DeviceRequest(driver="nvidia", device_ids=uuids,
                                       capabilities=[CAPABILITIES])],
        environment={**cuda_environment(held, uuids),
                     "NVIDIA_DRIVER_CAPABILITIES": ",".join(CAPABILITIES[1:])})
    shares = allocation.get(f"cuda{SHARES}")
    if shares and hami is not None:
        args.add(hami.container_args(share_parts(
            dict(sorted(shares.items(), key=lambda item: int(item[0]))), by_id)))
    return args
