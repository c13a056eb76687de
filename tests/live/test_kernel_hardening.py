"""Kernel hardening on real Docker, tried from inside a kernel: its user, capabilities, no new
privileges, the pids and open-files limits of the resource policy, no swap, no host path."""

import pytest

from agents_app.runtime.docker_backend import KERNEL_CAPABILITIES
from backendai_web.metrics_view import exposition
from identity_app.models import ResourcePolicy
from scheduling_app.models import ScalingGroup
from sessions_app.models import Kernel
from tests.live.test_agent_docker import S, create, wait_status

pytestmark = pytest.mark.docker

# Bit numbers from linux/capability.h.
CAPABILITY_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3,
                   "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7, "SETPCAP": 8,
                   "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18, "SYS_ADMIN": 21,
                   "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31}


def execute(client, session_id, command, timeout=30):
    response = client.post(f"/api/v1/sessions/{session_id}/execute/",
                           {"command": command, "timeout": timeout},
                           content_type="application/json")
    assert response.status_code == 200, response.content
    return response.json()


def status_field(status_text, name):
    return next(line.split(":", 1)[1].strip() for line in status_text.splitlines()
                if line.startswith(name + ":"))


def test_a_kernel_runs_as_its_groups_user_with_only_the_listed_capabilities_and_its_limits(
        live, as_alice, docker_client):
    ResourcePolicy.objects.filter(name="default").update(kernel_pids_limit=200,
                                                          kernel_open_files_limit=4096)
    ScalingGroup.objects.filter(name="default").update(kernel_uid=1234, kernel_gid=2345)
    session_id = create(as_alice, "hardened", startup_command="echo started > /home/work/started")
    wait_status(session_id, S.RUNNING)
    result = execute(as_alice, session_id,
                     "cat /proc/self/status; echo nofile=$(ulimit -n); "
                     "echo pids=$(cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max "
                     "2>/dev/null); mknod /home/work/dev c 1 3 2>&1 || echo mknod-refused; "
                     "echo home=$HOME; stat -c 'owner=%u:%g' /home/work; "
                     "while [ ! -e /home/work/started ]; do sleep 0.1; done; "
                     "stat -c 'command-wrote=%u:%g' /home/work/started; "
                     "echo init=$(stat -c %u:%g /proc/1)")
    assert result["exit_code"] == 0, result
    out = result["stdout"]
    # The execution, the kernel's command and its init: all the group's user, none root.
    assert status_field(out, "Uid").split() == ["1234"] * 4
    assert status_field(out, "Gid").split() == ["2345"] * 4
    assert "init=1234:2345" in out and "command-wrote=1234:2345" in out
    assert "home=/home/work" in out and "owner=1234:2345" in out  # its volume is its own
    allowed = sum(1 << CAPABILITY_BITS[name] for name in KERNEL_CAPABILITIES)
    # Not root: no capability in effect at all, and none beyond the list to gain.
    assert int(status_field(out, "CapEff"), 16) == 0
    assert int(status_field(out, "CapPrm"), 16) == 0
    assert int(status_field(out, "CapBnd"), 16) == allowed
    assert status_field(out, "NoNewPrivs") == "1"
    assert status_field(out, "Seccomp") == "2"  # Docker's default profile filters its calls
    assert "nofile=4096" in out and "pids=200" in out
    assert "mknod-refused" in out

    kernel = Kernel.objects.get(session_id=session_id)
    host = docker_client.containers.get(kernel.container_id).attrs["HostConfig"]
    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == sorted(KERNEL_CAPABILITIES)
    assert host["SecurityOpt"] == ["no-new-privileges"]  # and so never seccomp=unconfined
    assert not any("unconfined" in option for option in host["SecurityOpt"] or [])
    assert docker_client.containers.get(kernel.container_id).attrs["Config"]["User"] == (
        "1234:2345")
    assert host["PidsLimit"] == 200
    assert host["MemorySwap"] == host["Memory"] == 128 * 2**20  # no swap
    # Its own scratch volume is its only mount: no host path, no Docker socket.
    assert host["Binds"] == [f"bai-scratch-{kernel.pk}:/home/work:rw"]
    mounts = docker_client.containers.get(kernel.container_id).attrs["Mounts"]
    assert [(m["Type"], m["Destination"]) for m in mounts] == [("volume", "/home/work")]
    # The agent counted the start in Redis; the manager's /metrics shows it.
    text = exposition().decode()
    assert (f'backendai_agent_container_starts_total{{agent="{live.agent_id}",'
            f'outcome="started"}}') in text
    assert (f'backendai_agent_container_start_seconds_count{{agent="{live.agent_id}"}}'
            in text)
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_status(session_id, S.TERMINATED)


# The fork bomb and the memory hog beside another session: tests/live/test_kernel_probes.py.
