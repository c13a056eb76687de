"""Committing a session as an image (sessions_app/commits.py) through the Backend.AI routes:
what is asked of the agent, what its reports make of the task and the image, the
background-task events a client reads, and who may see and use the image. The commit itself
on Docker: tests/live/test_session_commit.py."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from asgiref.sync import async_to_sync

from agents_app.models import OWNER_LABEL, Image
from common import clock
from identity_app.keypairs import main_keypair
from sessions_app import commits
from sessions_app.enums import Status
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.models import BackgroundTask, SessionEvent
from sessions_app.spec import SessionRequestError, SessionSpec
from tests.factories import make_session
from tests.signing import signed_call


@pytest.fixture
def sent(monkeypatch):
    calls = []
    monkeypatch.setattr("agents_app.rpc._send", lambda agent, task, **kw: calls.append(
        (agent, task, kw)))
    return calls


def read_stream(response):
    async def collect():
        return [chunk async for chunk in response.streaming_content]
    return b"".join(async_to_sync(collect)()).decode()


def events_of(text):
    """(event, data) of each SSE message."""
    found = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines()
                     if not line.startswith(":"))
        if "event" in lines:
            found.append((lines["event"], lines["data"]))
    return found


def test_a_commit_is_named_after_the_owner_the_image_and_the_session(alice):
    session = make_session(alice, Status.RUNNING, name="s1")
    moment = datetime(2026, 11, 21, 22, 26, 2, tzinfo=UTC)
    prefix = f"bai-local/commit/alice-{alice.pk}"
    assert commits.committed_image(session, now=moment) == \
        f"{prefix}/busybox:s1-20261121-222602"
    assert commits.committed_image(session, "my-env") == f"{prefix}/my-env:latest"
    assert commits.committed_image(session, "my-env:v2") == f"{prefix}/my-env:v2"
    for bad in ("My-Env", "a/b", "-x", "x:", "x:-y", "", 7):
        with pytest.raises(SessionRequestError, match="image_name is a lowercase name"):
            commits.committed_image(session, bad)


def test_commit_asks_the_agent_and_answers_the_background_task(
        client, alice, sent, django_capture_on_commit_callbacks):
    session = make_session(alice, Status.RUNNING, name="s1")
    kernel = session.kernels.get()
    with django_capture_on_commit_callbacks(execute=True):
        response = signed_call(client, main_keypair(alice), "POST", "/session/s1/commit")
    assert response.status_code == 201, response.content
    answer = response.json()
    task = BackgroundTask.objects.get(pk=answer["bgtask_id"])
    assert answer == {"bgtask_id": str(task.pk), "kernel": str(kernel.pk), "path": None,
                      "image": task.result["image"]}
    assert task.state == "running" and task.user == alice and task.session == session
    [(agent_id, name, kwargs)] = sent
    assert (agent_id, name) == (kernel.agent_id, "agent.commit_kernel")
    assert kwargs["container_id"] == kernel.container_id and kwargs["task_id"] == str(task.pk)
    assert kwargs["image"] == answer["image"]
    assert kwargs["labels"] == {OWNER_LABEL: f"user:{alice.pk}",
                                "ai.backend.customized-image.name": answer["image"],
                                "ai.backend.committed-from": str(session.pk)}
    # One at a time.
    again = signed_call(client, main_keypair(alice), "POST", "/session/s1/commit")
    assert again.status_code == 409 and "A commit of session s1 is going on" in \
        again.json()["msg"]


def test_export_to_image_names_the_image_and_answers_a_task_id(client, alice, sent):
    make_session(alice, Status.RUNNING, name="s1")
    response = signed_call(client, main_keypair(alice), "POST",
                           "/session/s1/imagify?image_name=my-env")
    assert response.status_code == 200, response.content
    task = BackgroundTask.objects.get(pk=response.json()["task_id"])
    assert task.result["image"] == f"bai-local/commit/alice-{alice.pk}/my-env:latest"
    missing = signed_call(client, main_keypair(alice), "POST", "/session/s1/imagify")
    assert missing.status_code == 400 and "image_name is required" in missing.json()["msg"]


def test_only_a_running_session_is_committed(client, alice, sent):
    make_session(alice, name="waiting")
    response = signed_call(client, main_keypair(alice), "POST", "/session/waiting/commit")
    assert response.status_code == 409
    assert response.json()["type"] == "https://api.backend.ai/probs/invalid-session-state"
    assert "only a RUNNING session's kernel can be committed" in response.json()["msg"]
    assert not sent


def test_the_agents_reports_register_the_image_and_finish_the_task(client, alice, sent):
    session = make_session(alice, Status.RUNNING, name="s1")
    kernel = session.kernels.get()
    task = commits.start_commit(session, user=alice)
    image = task.result["image"]
    labels = {"ai.backend.kernelspec": "1", OWNER_LABEL: f"user:{alice.pk}",
              "ai.backend.resource.min.mem": "64m"}
    handle_kernel_event(kernel.pk, "commit_progress", {
        "task_id": str(task.pk), "current": 1, "message": "committing 500 MB: 3 s"})
    task.refresh_from_db()
    assert (task.current_progress, task.total_progress, task.message) == (
        1, 3, "committing 500 MB: 3 s")
    assert commits.event_of(task) == ("bgtask_updated", {
        "task_id": str(task.pk), "message": "committing 500 MB: 3 s",
        "current_progress": 1, "total_progress": 3})

    handle_kernel_event(kernel.pk, "commit_done", {
        "task_id": str(task.pk), "image": image, "image_id": "sha256:ab", "labels": labels,
        "size": 123, "seconds": 4.5})
    task.refresh_from_db()
    assert task.state == "done" and task.message == image and task.finished_at
    assert commits.event_of(task) == ("bgtask_done", {"task_id": str(task.pk),
                                                      "message": image})
    registered = Image.objects.get(name=image)
    assert registered.labels == labels and registered.min_slots == {"mem": str(64 * 2**20)}
    assert SessionEvent.objects.filter(session=session, name="kernel_committed",
                                       reason=f"committed as {image}").exists()

    # The SSE stream of a finished task: its end, then server_close.
    stream = signed_call(client, main_keypair(alice), "GET",
                         f"/events/background-task?task_id={task.pk}")
    assert stream.status_code == 200 and stream["Content-Type"] == "text/event-stream"
    events = events_of(read_stream(stream))
    assert [name for name, _ in events] == ["bgtask_done", "server_close"]
    assert image in events[0][1]


def test_a_failed_or_lost_commit_fails_its_task(alice, sent):
    session = make_session(alice, Status.RUNNING, name="s1")
    kernel = session.kernels.get()
    task = commits.start_commit(session, user=alice)
    handle_kernel_event(kernel.pk, "commit_failed", {"task_id": str(task.pk),
                                                     "error": "no space left on device"})
    task.refresh_from_db()
    assert task.state == "failed"
    assert commits.event_of(task)[0] == "bgtask_failed"
    assert "no space left on device" in task.message

    lost = commits.start_commit(session, user=alice)  # the failed one is over: a new one
    with time_machine.travel(clock.now() + timedelta(seconds=61)):
        assert commits.expire_if_stale(lost)
    lost.refresh_from_db()
    assert lost.state == "failed" and "No word from the session's agent" in lost.message


def test_another_users_task_and_committed_image_are_not_theirs(client, alice, bob, sent):
    session = make_session(alice, Status.RUNNING, name="s1")
    task = commits.start_commit(session, user=alice)
    image = task.result["image"]
    Image.objects.create(name=image, labels={OWNER_LABEL: f"user:{alice.pk}"})
    bob_kp = main_keypair(bob)
    events = signed_call(client, bob_kp, "GET", f"/events/background-task?task_id={task.pk}")
    assert events.status_code == 404

    listed = signed_call(client, bob_kp, "GET", "/api/v1/images/").json()
    names = [i["name"] for i in (listed["results"] if isinstance(listed, dict) else listed)]
    assert image not in names and "bai-local/busybox:latest" in names
    with pytest.raises(SessionRequestError, match="committed from another user's session"):
        SessionSpec.build(keypair=bob_kp, name="x", image=image)
    SessionSpec.build(keypair=main_keypair(alice), name="x", image=image)  # hers
