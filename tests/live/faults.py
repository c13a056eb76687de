"""What the fault tests share: a busybox session made, awaited, destroyed; beat's lost-agent
sweep done by the test while it waits; `check_invariants` awaited clean."""

import time

from sessions_app.enums import Status
from sessions_app.lifecycle import progress
from sessions_app.lifecycle.invariants import check_invariants
from sessions_app.models import Kernel, Session
from tests.support import IMAGE, wait_for

S = Status


def create(client, name, **fields):
    response = client.post("/api/v1/sessions/", {
        "name": name, "image": IMAGE, "resources": {"cpu": "0.5", "mem": "128m"}, **fields,
    }, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]



def status_of(session_id):
    return Session.objects.get(pk=session_id).status



def running(session_id):
    wait_for(lambda: status_of(session_id) == S.RUNNING, timeout=60, message="RUNNING")
    return Kernel.objects.get(session_id=session_id)



def containers_of(docker_client, kernel_id):
    return docker_client.containers.list(ignore_removed=True,
        all=True, filters={"label": f"ai.backend.kernel-id={kernel_id}"})



def sweeping(seconds):
    """What beat does while the test waits: the lost-agent sweep every 0.5 s."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        progress.sweep_lost_agents()
        time.sleep(0.5)



def assert_invariants_hold(timeout=20):
    """Clean within `timeout` (the agent's next heartbeats settle what was in flight)."""
    def clean():
        checks = check_invariants()
        return all(not check.violations for check in checks) or None

    try:
        wait_for(clean, timeout=timeout, interval=0.5, message="check_invariants clean")
    except AssertionError:
        raise AssertionError([(c.name, c.violations) for c in check_invariants()]) from None



def destroy_and_wait(client, session_id, docker_client):
    kernel = Kernel.objects.get(session_id=session_id)
    assert client.delete(f"/api/v1/sessions/{session_id}/").status_code == 200
    wait_for(lambda: status_of(session_id) == S.TERMINATED, timeout=60, message="TERMINATED")
    wait_for(lambda: not containers_of(docker_client, kernel.pk), timeout=30,
             message="its container removed")
