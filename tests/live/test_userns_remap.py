"""An engine with user-namespace remapping on (`dockerd --userns-remap=default`, as an
operator turns it on: docs/agent.md, "User-namespace remapping"): the agent's kernel runs
there unchanged, and what its unprivileged user writes is owned on the host by a
subordinate uid of the engine's `dockremap` user, not by that uid itself nor by root."""

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from agents_app.runtime.runner import KernelRunner
from tests.live.two_hosts import SecondHost, tools_problem
from tests.support import IMAGE, need

pytestmark = pytest.mark.docker

KERNEL_UID, KERNEL_GID = 1000, 1001


def subordinate_start(path, name="dockremap"):
    """The first id of `name`'s range in /etc/subuid or /etc/subgid (made by dockerd)."""
    for line in Path(path).read_text().splitlines():
        owner, start, _count = line.split(":")
        if owner == name:
            return int(start)
    raise AssertionError(f"no {name} range in {path}")


@pytest.fixture(scope="module")
def remapped_engine(docker_client):
    """A second engine, in a network namespace of its own, with remapping on."""
    need("a second Docker engine", tools_problem())
    # Its data root where the remapped root can reach it: dockerd refuses a path with a
    # directory it cannot traverse (a checkout under a 0700 mktemp directory, as in CI).
    base = Path(tempfile.mkdtemp(prefix="bai-userns-"))
    base.chmod(0o711)
    host = SecondHost(IMAGE, base=base, netns="u2", addresses=("10.202.0.1", "10.202.0.2"),
                      bip="172.28.0.1/16", swarm=False,
                      dockerd_args=["--userns-remap=default"]).up()
    yield host.client
    host.down()
    shutil.rmtree(base, ignore_errors=True)


def kernel_spec(image):
    return {
        "session_id": str(uuid.uuid4()), "session_name": "userns", "kernel_id": str(uuid.uuid4()),
        "session_type": "interactive", "owner_user_id": "1", "startup_command": "",
        "environ": {}, "grace_period": 1, "cluster_size": 1, "pre_stop_command": "",
        "ssh_keypair": None, "pids_limit": None, "open_files_limit": None,
        "allow_outbound": True, "network_driver": "bridge", "network_name": None,
        "cluster_hosts": ["main1"], "mounts": [], "image": image,
        "slots": {"cpu": "0.5", "mem": str(64 * 2**20)}, "bootstrap_script": "",
        "cluster_role": "main", "cluster_idx": 1, "cluster_hostname": "main1",
        "kernel_uid": KERNEL_UID, "kernel_gid": KERNEL_GID}


def test_a_file_a_kernel_writes_under_userns_remap_is_owned_by_a_remapped_uid_on_the_host(
        remapped_engine):
    assert "name=userns" in remapped_engine.info()["SecurityOptions"]
    uid_base = subordinate_start("/etc/subuid")
    gid_base = subordinate_start("/etc/subgid")
    spec = kernel_spec(IMAGE)
    runner, container = KernelRunner.start(remapped_engine, "userns-test", spec)
    try:
        written = container.exec_run(["/bin/sh", "-c", "echo hello > /home/work/written && "
                                      "stat -c %u:%g /home/work/written && id -u"])
        assert written.exit_code == 0, written.output
        # Inside: the group's user, as on any engine.
        assert written.output.decode().split() == [f"{KERNEL_UID}:{KERNEL_GID}",
                                                   str(KERNEL_UID)]
        volume = remapped_engine.volumes.get(f"bai-scratch-{spec['kernel_id']}")
        on_host = os.stat(Path(volume.attrs["Mountpoint"]) / "written")
        # On the host: the remapped ids, not the kernel's own nor root.
        assert (on_host.st_uid, on_host.st_gid) == (uid_base + KERNEL_UID,
                                                    gid_base + KERNEL_GID)
        assert uid_base >= 65536
    finally:
        runner.teardown(forced=True)
