"""A session's main kernel saved as an image (Backend.AI's `session commit`,
`ComputeSession.commit` and `export_to_image`): `docker commit` of its container on its
agent, registered at once as an image its owner's new sessions can use, with its progress
as Backend.AI's background-task events (`bgtask_updated`, then `bgtask_done` whose message
is the image's name, or `bgtask_failed`).

The image is the owner's: it is named under bai-local/commit/<owner>/ and labelled
ai.backend.customized-image.owner, and only its owner (and admins) see and use it
(agents_app.models.ImageQuerySet.usable_by): it holds what the kernel wrote outside
/home/work (the scratch volume is not part of it).
"""

import logging
import re
from datetime import timedelta

from django.db import transaction

from agents_app import rpc
from agents_app.models import (
    COMMITTED_FROM_LABEL,
    CUSTOMIZED_NAME_LABEL,
    OWNER_LABEL,
    Image,
    resource_limits,
)
from common import clock
from sessions_app import engine, events
from sessions_app.enums import Status
from sessions_app.models import BackgroundTask, Session
from sessions_app.spec import SessionRequestError

log = logging.getLogger(__name__)
KIND = "session-commit"
STAGES = 3  # the events' total_progress: committing, committed, registered
PREFIX = "bai-local/commit"
# An agent that commits reports every second (COMMIT_REPORT_SECONDS): a commit silent
# this long lost its agent, and is failed for whoever waits on it.
STALE = timedelta(seconds=60)
IMAGE_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")


def bgtask_group(task_id):
    return f"bgtask.{task_id}"


def owner_namespace(user):
    """bai-local/commit/<this>/…: the owner's name as Docker takes it, and their id (two
    names may look alike once lowercased)."""
    slug = re.sub(r"[^a-z0-9]+", "-", user.get_username().lower()).strip("-") or "user"
    return f"{slug}-{user.pk}"


def committed_image(session, name=None, now=None):
    """The image a commit of `session` makes: <PREFIX>/<owner>/<its image's name>:<session
    name>-<time> for a commit, <PREFIX>/<owner>/<name> (tag `latest` unless `name` has one)
    for export_to_image."""
    namespace = f"{PREFIX}/{owner_namespace(session.user)}"
    if name is not None:
        if not isinstance(name, str) or not IMAGE_NAME.match(name):
            raise SessionRequestError(
                "image_name is a lowercase name (letters, digits and '.', '_' or '-' between "
                "them), with a ':tag' if you like.", "image_name")
        return f"{namespace}/{name}" if ":" in name else f"{namespace}/{name}:latest"
    base = session.image.rsplit("/", 1)[-1].split(":", 1)[0]
    moment = (now or clock.now()).strftime("%Y%m%d-%H%M%S")
    return f"{namespace}/{base}:{session.name}-{moment}"


@transaction.atomic
def start_commit(session, *, user, name=None):
    """Ask the main kernel's agent to commit its container; the BackgroundTask that
    follows it. One commit of a session at a time (409), of a RUNNING kernel only (409)."""
    session = Session.objects.select_for_update().select_related("user").get(pk=session.pk)
    kernel = session.main_kernel
    if kernel.status != Status.RUNNING or not kernel.agent_id or not kernel.container_id:
        raise SessionRequestError(f"The session is {kernel.status}; only a RUNNING session's "
                                  "kernel can be committed.", status_code=409)
    going = BackgroundTask.objects.filter(session=session, kind=KIND,
                                          state=BackgroundTask.State.RUNNING).first()
    if going is not None and not expire_if_stale(going):
        raise SessionRequestError(f"A commit of session {session.name} is going on "
                                  f"(task {going.pk}).", status_code=409)
    image = committed_image(session, name)
    task = BackgroundTask.objects.create(
        kind=KIND, user=user, session=session, total_progress=STAGES,
        message=f"committing session {session.name} as {image}",
        result={"image": image, "kernel": str(kernel.pk)})
    labels = {OWNER_LABEL: f"user:{session.user_id}", CUSTOMIZED_NAME_LABEL: name or image,
              COMMITTED_FROM_LABEL: str(session.pk)}
    engine.record_event(session, "kernel_commit_started", kernel=kernel,
                        actor=user.get_username(), reason=f"committing as {image}",
                        data={"image": image, "task_id": str(task.pk)})
    transaction.on_commit(lambda: rpc.send_commit_kernel(kernel, str(task.pk), image, labels))
    return task


# The agent's reports (sessions_app.lifecycle.agent_reports).

def record_progress(kernel, data):
    task = _running(data)
    if task is None:
        return
    task.current_progress = min(float(data.get("current", 1)), STAGES - 1)
    task.message = str(data.get("message") or task.message)[:2000]
    task.save(update_fields=["current_progress", "message", "updated_at"])
    _publish(task)


@transaction.atomic
def record_committed(kernel, data, actor):
    """The image is made: registered for its owner's sessions, and the task is done."""
    task = _running(data)
    image, labels = data.get("image"), data.get("labels") or {}
    if not image:
        return
    architecture = kernel.agent.architecture if kernel.agent_id else "x86_64"
    Image.objects.update_or_create(name=image, architecture=architecture, defaults={
        "labels": labels, "min_slots": resource_limits(labels)[0].to_json()})
    engine.record_event(kernel.session, "kernel_committed", kernel=kernel, actor=actor,
                        reason=f"committed as {image}",
                        data={"image": image, "seconds": data.get("seconds"),
                              "size": data.get("size")})
    if task is not None:
        _finish(task, BackgroundTask.State.DONE, image,
                {"image_id": data.get("image_id"), "size": data.get("size"),
                 "seconds": data.get("seconds")})


@transaction.atomic
def record_commit_failed(kernel, data, actor):
    error = str(data.get("error") or "the agent gave no reason")[:500]
    engine.record_event(kernel.session, "kernel_commit_failed", kernel=kernel, actor=actor,
                        reason=f"commit failed: {error}"[:255])
    task = _running(data)
    if task is not None:
        _finish(task, BackgroundTask.State.FAILED, f"The commit failed: {error}")


def expire_if_stale(task, now=None):
    """A running task its agent has not reported on for STALE is failed; True if so."""
    if task.state != BackgroundTask.State.RUNNING or \
            (now or clock.now()) - task.updated_at < STALE:
        return False
    with transaction.atomic():
        if BackgroundTask.objects.filter(pk=task.pk, state=BackgroundTask.State.RUNNING,
                                         updated_at=task.updated_at).exists():
            _finish(task, BackgroundTask.State.FAILED,
                    f"No word from the session's agent for {STALE.seconds} s: the commit "
                    "was lost (the agent stopped?). Try again.")
            return True
    return False


def _running(data):
    return BackgroundTask.objects.filter(
        pk=data.get("task_id"), state=BackgroundTask.State.RUNNING).first() \
        if _is_uuid(data.get("task_id")) else None


def _is_uuid(value):
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f-]{32,36}", value) is not None


def _finish(task, state, message, result=None):
    task.state, task.message, task.finished_at = state, message, clock.now()
    if state == BackgroundTask.State.DONE:
        task.current_progress = task.total_progress
    task.result = {**task.result, **(result or {})}
    task.save()
    _publish(task)


def event_of(task):
    """(event name, data) of Backend.AI's background-task event for the task's state."""
    if task.state == BackgroundTask.State.RUNNING:
        return "bgtask_updated", {"task_id": str(task.pk), "message": task.message,
                                  "current_progress": task.current_progress,
                                  "total_progress": task.total_progress}
    return f"bgtask_{task.state}", {"task_id": str(task.pk), "message": task.message}


def _publish(task):
    name, data = event_of(task)
    msg = {"event": name, "data": data}
    transaction.on_commit(lambda: events.publish([bgtask_group(task.pk)], msg))
