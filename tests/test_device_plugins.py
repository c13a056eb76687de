"""The agent's device plugins without Docker (agents_app/runtime/devices/): loading them as
entry points, the mock plugin's device nodes and container arguments, the allocation map,
HAMi-core's configuration for shares, and the CUDA plugin where NVML finds a GPU."""

import logging
import os
import stat
from decimal import Decimal
from pathlib import Path

import pytest

from agents_app.management.commands.run_agent import load_devices
from agents_app.runtime import devices, errors
from agents_app.runtime.agent import Agent
from agents_app.runtime.devices import cuda, mock, shares


@pytest.fixture
def node_dir(tmp_path, settings):
    settings.MOCK_DEVICE_DIR = str(tmp_path / "dev")
    settings.VAR_DIR = tmp_path / "var"
    settings.DEVICE_SHARE_LIBRARY = str(tmp_path / "no-library.so")
    os.mkdir(settings.MOCK_DEVICE_DIR)
    return tmp_path / "dev"


def mock_set(count=2, agent_id="a1"):
    return devices.load(["mock"], agent_id, {"mock_devices": count})


def test_plugins_are_entry_points_and_enabled_per_agent(node_dir):
    found = devices.load(["mock"], "a1", {"mock_devices": 2})
    assert list(found.plugins) == ["cuda"] and found.plugins["cuda"].name == "mock"
    assert found.slots() == {"cuda.device": 2, "cuda.shares": 2}
    assert load_devices({"devices": "", "mock_devices": 3, "id": "a1"}).slots()[
        "cuda.device"] == 3
    assert not load_devices({"devices": "", "mock_devices": 0, "id": "a1"})


def test_a_plugin_that_fails_to_load_is_left_out_saying_so_once(node_dir, caplog):
    caplog.set_level(logging.ERROR, logger="agents_app.runtime.devices")
    found = devices.load(["nosuch", "mock", "cuda"], "a1", {"mock_devices": 0})
    assert not found and found.slots() == {}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert messages[0].startswith("device plugin nosuch is not installed (installed: cuda, "
                                  "mock)")
    assert messages[1] == ("device plugin mock failed to load, its devices are not offered: "
                           "no mock devices asked for (run_agent --mock-devices N)")
    assert messages[2].startswith("device plugin cuda failed to load")
    agent = Agent("a1", "default", slots={"cpu": "1", "mem": "1g"}, devices=found)
    assert agent.slots() == {"cpu": "1", "mem": "1g"}  # none of its slots offered


def test_each_mock_device_is_a_character_device_of_its_own(node_dir):
    mock_set(2, agent_id="agent/one")
    nodes = sorted(os.listdir(node_dir))
    assert nodes == ["bai-mock-agent_one-0", "bai-mock-agent_one-1"]
    info = os.stat(node_dir / nodes[0])
    assert stat.S_ISCHR(info.st_mode) and (os.major(info.st_rdev), os.minor(info.st_rdev)) \
        == (1, 3)
    mock_set(2, agent_id="agent/one")  # made once, kept
    (node_dir / "bai-mock-a2-0").write_text("a file")
    with pytest.raises(devices.DevicePluginError, match="is not a mock device node"):
        mock.MockPlugin("a2", {"mock_devices": 1}).init()


def test_the_allocation_map_counts_containers_and_starts_and_takes_the_plan(node_dir):
    found = mock_set(2)
    held = {"k0": {"cuda.shares": {"0": "0.5"}}}
    assert found.allocate("k1", {"cpu": "1"}, None, held) == {}
    # the scheduler's plan, free here: taken
    assert found.allocate("k1", {"cuda.shares": "0.5"}, {"cuda.shares": {"1": "0.5"}},
                          held) == {"cuda.shares": {"1": "0.5"}}
    # k1 is being started (not a container yet): its half of device 1 counts
    with pytest.raises(devices.DevicesUnavailable) as unavailable:
        found.allocate("k3", {"cuda.device": "1"}, None, held)
    assert str(unavailable.value) == ("cuda.device 1 not free on this agent (in use: 0: 0.5,"
                                      " 1: 0.5)")
    assert errors.kind_of(unavailable.value) == errors.AGENT  # tried elsewhere at once
    found.release("k1")
    assert found.allocate("k3", {"cuda.device": "1"}, None, held) == {
        "cuda.device": {"1": "1"}}
    with pytest.raises(devices.DevicesUnavailable, match="offers no rocm.device"):
        found.allocate("k4", {"rocm.device": "1"}, None, {})


def test_a_mock_device_is_attached_as_a_device_node_with_cudas_variables(node_dir):
    found = mock_set(3)
    args = found.container_args({"cuda.device": {"2": "1", "0": "1"}}, "k1")
    assert args.devices == [f"{node_dir}/bai-mock-a1-0:/dev/bai-mock0:rwm",
                            f"{node_dir}/bai-mock-a1-2:/dev/bai-mock2:rwm"]
    assert args.environment == {"CUDA_VISIBLE_DEVICES": "0,1",
                                "NVIDIA_VISIBLE_DEVICES": "0,2",
                                "CUDA_GLOBAL_DEVICE_IDS": "0:0,1:2"}
    assert args.create_kwargs() == {"devices": args.devices}


def test_shares_pass_hami_cores_limits_and_library(node_dir, settings):
    found = mock_set(2)
    args = found.container_args({"cuda.shares": {"1": "0.75", "0": "0.75"}}, "k1")
    assert {k: v for k, v in args.environment.items() if k.startswith("CUDA_DEVICE_")} == {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "12288m", "CUDA_DEVICE_MEMORY_LIMIT_1": "12288m",
        "CUDA_DEVICE_SM_LIMIT": "75",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/cudevshr.cache"}
    # the mock's stand-in for the library is mounted, never preloaded (it is no library)
    assert [m["bind"] for m in args.mounts.values()] == ["/usr/local/vgpu/libvgpu.so"]
    library = node_dir.parent / "libvgpu.so"
    library.write_bytes(b"\x7fELF" + bytes(60))
    hami = shares.HamiCore(str(library), str(node_dir.parent / "preload"))
    mounts = hami.container_args([(Decimal("0.5"), 2**30)]).mounts
    preload = next(h for h, m in mounts.items() if m["bind"] == "/etc/ld.so.preload")
    assert Path(preload).read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert mounts[str(library)] == {"bind": "/usr/local/vgpu/libvgpu.so", "mode": "ro"}


def test_mock_measures_say_what_is_allocated(node_dir):
    found = mock_set(2)
    described = found.describe({"k0": {"cuda.shares": {"0": "0.5"}}})
    assert [(d["id"], d["utilization"], d["held"]) for d in described] == [
        ("0", 50.0, [{"kernel_id": "k0", "slot": "cuda.shares", "amount": "0.5"}]),
        ("1", 0.0, [])]
    assert described[0]["mem_used"] == 8 * 2**30 and described[0]["plugin"] == "mock"
    assert described[0]["slots"] == ["cuda.device", "cuda.shares"]


def test_gpus_are_attached_by_an_nvidia_device_request_by_uuid():
    gpus = [devices.Device(id=str(n), model="A100", memory=40 * 2**30, uuid=f"GPU-{n}")
            for n in range(2)]
    args = cuda.gpu_args(gpus, {"cuda.device": {"1": Decimal(1)}})
    request = args.device_requests[0]
    assert (request["Driver"], request["DeviceIDs"]) == ("nvidia", ["GPU-1"])
    assert request["Capabilities"] == [["gpu", "utility", "compute"]]
    assert args.environment["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
    assert args.environment["CUDA_GLOBAL_DEVICE_IDS"] == "0:1"


def test_the_cuda_plugin_reads_the_gpus_nvml_finds(settings, tmp_path):
    """Runs where NVML finds a GPU (docs/devices.md says how); says so where it finds none."""
    settings.VAR_DIR = tmp_path
    try:
        nvml = cuda.nvml()
        count = nvml.nvmlDeviceGetCount()
    except devices.DevicePluginError as exc:
        pytest.skip(f"no GPU here: {exc}")
    if not count:
        pytest.skip("no GPU here: NVML finds none")
    plugin = cuda.CUDAPlugin("a1", {})
    plugin.init()
    found = plugin.list_devices()
    assert len(found) == count and all(d.uuid and d.memory > 0 for d in found)
    measured = plugin.measure({})
    assert set(measured) == {d.id for d in found}
    assert all(0 <= m["utilization"] <= 100 and m["mem_total"] > 0 for m in measured.values())
    assert plugin.slots()["cuda.device"] == count
