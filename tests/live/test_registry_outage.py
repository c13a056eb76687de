"""A registry away for a while (Sokovan's retries with a backoff, exclusions that expire):
a session whose image must be pulled while the registry does not answer waits, saying why
and until when, and runs once the registry answers again, in a scaling group of one agent.
Real Docker, a real registry (Debian's docker-registry), the live worker and agent."""

import time
from datetime import datetime, timedelta

import pytest

from agents_app.models import Image
from scheduling_app import tasks
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.models import Session, SessionEvent
from tests.support import IMAGE, Registry, wait_for

pytestmark = pytest.mark.docker
S = Status


@pytest.fixture
def registry(tmp_path):
    registry = Registry(tmp_path)
    registry.start()
    yield registry
    registry.stop()


def test_a_session_waits_through_a_registry_outage_and_runs_when_it_answers_again(
        live, as_alice, registry, docker_client):
    ScalingGroup.objects.filter(name="default").update(
        retry_backoff=1, retry_backoff_max=2, exclusion_timeout=5)
    remote = f"127.0.0.1:{registry.port}/bai-local/busybox:outage"
    docker_client.images.get(IMAGE).tag(remote)
    for line in docker_client.images.push(remote, stream=True, decode=True):
        assert "error" not in line, line
    docker_client.images.remove(remote)
    Image.objects.update_or_create(name=remote)
    registry.stop()

    answer = as_alice.post("/api/v1/sessions/", {
        "name": "through-outage", "image": remote,
        "resources": {"cpu": "0.5", "mem": "64m"}}, content_type="application/json")
    assert answer.status_code == 201, answer.content
    session_id = answer.json()["id"]
    retries = SessionEvent.objects.filter(session_id=session_id,
                                          name="kernel_retry_preparing")
    # Three pulls refused, spaced out by the backoff; then the only agent is left out
    # for a while, and the session waits PENDING, saying until when.
    wait_for(lambda: retries.count() == 2, timeout=60, message="two retries")
    first, second = retries.order_by("created_at")
    # The second failure is of the try sent when the first's backoff was over.
    assert second.created_at >= datetime.fromisoformat(first.data["at"])
    assert datetime.fromisoformat(first.data["at"]) - first.created_at >= \
        timedelta(seconds=0.5)
    wait_for(lambda: "tried again from" in Session.objects.get(pk=session_id).pending_reason,
             timeout=60, message="the session waiting for the agent's exclusion to expire")

    registry.start()
    # Beat's scheduling pass, every second (no beat runs in the live tests).
    deadline = time.monotonic() + 90
    while Session.objects.get(pk=session_id).status != S.RUNNING:
        assert time.monotonic() < deadline, Session.objects.get(pk=session_id).status_info
        tasks.schedule("default")
        time.sleep(1)
    session = Session.objects.get(pk=session_id)
    assert session.status == S.RUNNING
    as_alice.delete(f"/api/v1/sessions/{session_id}/")
    wait_for(lambda: Session.objects.get(pk=session_id).status == S.TERMINATED, timeout=60,
             message="TERMINATED")
    docker_client.images.remove(remote, force=True)
