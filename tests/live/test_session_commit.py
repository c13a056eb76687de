"""`backend.ai session commit` (both client releases) against the running system: the main
kernel's container is committed on its agent, the image registered for its owner, and a new
session from it has what the first one wrote outside /home/work, none of the first one's
kernel labels or variables; the SDK's BackgroundTask events follow the commit; 26.9.6's
`session convert-to-image` shows its progress and names the image."""

import contextlib
import json

import pytest
from docker.errors import DockerException

from agents_app.models import OWNER_LABEL, Image
from identity_app.keypairs import main_keypair
from sessions_app.enums import Status
from sessions_app.models import BackgroundTask, Session
from tests.support import IMAGE, wait_for

pytestmark = pytest.mark.docker

LISTEN = """
import asyncio, json, sys
from ai.backend.client.session import AsyncSession

async def main():
    async with AsyncSession() as api:
        answer = await api.ComputeSession(sys.argv[1]).commit()
        print(json.dumps({"answer": answer}), flush=True)
        async with api.BackgroundTask(answer["bgtask_id"]).listen_events() as events:
            async for event in events:
                print(json.dumps({"event": event.event, "data": event.data}), flush=True)

asyncio.run(main())
"""


@pytest.fixture
def committed_images(docker_client):
    """Images the test commits: removed at its end."""
    made = []
    yield made
    for name in made:
        with contextlib.suppress(DockerException):  # never made, or gone already
            docker_client.images.remove(name, force=True)


def created(backendai, keypair, name, image, *extra):
    code, out = backendai(keypair, "session", "create", "--name", name, "-r", "cpu=0.25",
                          "-r", "mem=64m", *extra, image, timeout=180)
    assert code == 0, out
    session = Session.objects.filter(name=name).order_by("-created_at").first()
    assert session.status == Status.RUNNING, out
    return session


def container_of(docker_client, session):
    return docker_client.containers.get(session.kernels.get().container_id)


def test_a_committed_session_is_an_image_for_its_owners_new_sessions(
        backendai, alice, bob, docker_client, committed_images):
    kp = main_keypair(alice)
    first = created(backendai, kp, "to-commit", IMAGE, "-e", "GREETING=hello")
    source = container_of(docker_client, first)
    assert source.exec_run(["/bin/sh", "-c", "mkdir -p /opt && echo kept > /opt/marker"
                            ], user="0").exit_code == 0  # outside /home/work: root's

    code, out = backendai(kp, "session", "commit", "to-commit")
    assert code == 0 and "Request to commit" in out, out
    task = BackgroundTask.objects.get(session=first)
    wait_for(lambda: BackgroundTask.objects.get(pk=task.pk).state != "running", timeout=120,
             message="the commit to finish")
    task.refresh_from_db()
    image = task.result["image"]
    committed_images.append(image)
    assert task.state == "done" and task.message == image, task.message
    assert image.startswith(f"bai-local/commit/alice-{alice.pk}/busybox:to-commit-")
    registered = Image.objects.get(name=image)
    assert registered.labels[OWNER_LABEL] == f"user:{alice.pk}"

    second = created(backendai, kp, "from-commit", image)
    container = container_of(docker_client, second)
    assert container.exec_run(["cat", "/opt/marker"]).output == b"kept\n"
    # The first kernel's own labels and variables are not the second's.
    labels = container.labels
    assert labels["ai.backend.session-id"] == str(second.pk)
    assert labels["ai.backend.scratch-volume"] != source.labels["ai.backend.scratch-volume"]
    env = dict(e.partition("=")[::2] for e in container.attrs["Config"]["Env"])
    assert env.get("GREETING", "") == "" and env["BACKENDAI_SESSION_ID"] == str(second.pk)

    # Bob can neither see nor use it.
    code, out = backendai(main_keypair(bob), "session", "create", "--name", "bobs", image)
    assert code == 1 and "committed from another user's session" in out, out


def test_the_sdks_background_task_events_follow_a_commit(backendai, alice, docker_client,
                                                         committed_images):
    kp = main_keypair(alice)
    created(backendai, kp, "sdk-commit", IMAGE)
    code, out = backendai.python(kp, LISTEN.replace("sys.argv[1]", '"sdk-commit"'),
                                 timeout=180)
    assert code == 0, out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    answer = lines[0]["answer"]
    committed_images.append(answer["image"])
    events = [(line["event"], json.loads(line["data"])) for line in lines[1:]]
    assert events[-1] == ("server_close", {}), events  # as the manager ends the stream
    assert events[-2] == ("bgtask_done", {"task_id": answer["bgtask_id"],
                                          "message": answer["image"]}), events
    assert events[0][0] == "bgtask_updated" and events[0][1]["total_progress"] == 3
    assert all(name == "bgtask_updated" for name, _ in events[:-2])
    assert docker_client.images.get(answer["image"])


@pytest.mark.parametrize("backendai_cli", ["26.9.6"], indirect=True)  # 23.9.10 has no such
def test_convert_to_image_shows_progress_and_names_the_image(backendai, alice, docker_client,
                                                             committed_images):
    kp = main_keypair(alice)
    created(backendai, kp, "to-convert", IMAGE)
    code, out = backendai(kp, "session", "convert-to-image", "to-convert", "my-env",
                          timeout=180)
    image = f"bai-local/commit/alice-{alice.pk}/my-env:latest"
    committed_images.append(image)
    assert code == 0 and "Session export process completed." in out, out
    assert docker_client.images.get(image)
    assert Image.objects.filter(name=image).exists()
