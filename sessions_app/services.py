"""Creating sessions: validation of the request, then the PENDING rows, then a scheduler kick."""

import re
import uuid

from django.conf import settings
from django.db import IntegrityError, transaction

from backendai_web.celery import send_task_safely
from scheduling_app.models import ScalingGroup, default_project
from scheduling_app.slots import ResourceSlots, SlotError
from storage_app.folders import FolderError, add_mounts, resolve_mounts

from . import clock, engine
from .models import FINISHED_STATUSES, LIVE_STATUSES, Kernel, Session, SessionType, Status

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_RESOURCES = {"cpu": "1", "mem": "256m"}
MAX_CLUSTER_SIZE = 32


class SessionRequestError(Exception):
    """A request that cannot become a session; the message says why, `field` says where."""

    def __init__(self, message, field=None, status_code=400):
        super().__init__(message)
        self.message, self.field, self.status_code = message, field, status_code


def validate_name(name):
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise SessionRequestError(
            "A session name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit.", "name",
        )
    return name


def create_session(*, keypair, user, name, image, session_type=SessionType.INTERACTIVE,
                   resources=None, cluster_size=1, cluster_mode="single-node",
                   startup_command="", scaling_group="default", grace_period=None,
                   batch_timeout=None, tag="", project=None, actor=None,
                   pre_stop_command="", dependencies=(), priority=None,
                   may_raise_priority=False, preemptible=False, mounts=None) -> Session:
    """`dependencies` are sessions that must be RUNNING (or batch sessions finished with
    success) before this one is scheduled. `priority` defaults to the resource policy's;
    only with `may_raise_priority` (admins) may it be above that, up to the policy's
    maximum. A session is `preemptible` when its owner says so or its policy makes every
    session so."""
    validate_name(name)
    if not isinstance(image, str) or not image.strip():
        raise SessionRequestError("An image name is required, such as "
                                  f"{settings.DEFAULT_KERNEL_IMAGE}.", "image")
    if session_type not in SessionType.values:
        raise SessionRequestError(
            f"session_type must be one of {', '.join(SessionType.values)}.", "session_type")
    try:
        slots = ResourceSlots.parse(resources or DEFAULT_RESOURCES, allow_zero=False)
    except SlotError as exc:
        raise SessionRequestError(str(exc), "resources") from None
    if not isinstance(cluster_size, int) or not 1 <= cluster_size <= MAX_CLUSTER_SIZE:
        raise SessionRequestError(
            f"cluster_size must be a whole number from 1 to {MAX_CLUSTER_SIZE}.", "cluster_size")
    if cluster_mode not in ("single-node", "multi-node"):
        raise SessionRequestError("cluster_mode must be single-node or multi-node.",
                                  "cluster_mode")
    if grace_period is not None and (not isinstance(grace_period, int) or grace_period < 0):
        raise SessionRequestError("grace_period must be a whole number of seconds.",
                                  "grace_period")
    group = ScalingGroup.objects.filter(name=scaling_group, is_active=True).first()
    if group is None:
        raise SessionRequestError(f"There is no active scaling group named {scaling_group!r}.",
                                  "scaling_group")
    if session_type == SessionType.BATCH and not startup_command:
        raise SessionRequestError("A batch session needs a startup command.", "startup_command")
    try:
        folders = resolve_mounts(mounts, user=user, scaling_group=group)
    except FolderError as exc:
        raise SessionRequestError(exc.message, "mounts", exc.status_code) from None
    project = project or default_project()
    policy = keypair.resource_policy
    priority = check_priority(priority, policy, may_raise_priority)
    with transaction.atomic():
        if policy.max_pending_session_count is not None:
            pending = Session.objects.filter(keypair=keypair, status=Status.PENDING).count()
            if pending >= policy.max_pending_session_count:
                raise SessionRequestError(
                    f"You have {pending} pending sessions, the most your resource policy "
                    f"{policy.name!r} allows; wait for one to start or cancel one.",
                    status_code=429,
                )
        if Session.objects.filter(keypair=keypair, name=name, status__in=LIVE_STATUSES).exists():
            raise SessionRequestError(f"You already have a live session named {name!r}.", "name",
                                      status_code=409)
        queued = {Status.PENDING: clock.now().isoformat()}
        try:
            with transaction.atomic():
                session = Session.objects.create(
                    name=name, keypair=keypair, user=user, domain=project.domain,
                    project=project, session_type=session_type, cluster_mode=cluster_mode,
                    cluster_size=cluster_size, image=image.strip(),
                    requested_slots=slots.to_json(), scaling_group=group,
                    startup_command=startup_command or "", grace_period=grace_period,
                    batch_timeout=batch_timeout, tag=tag or "", status_history=queued,
                    pre_stop_command=pre_stop_command or "", priority=priority,
                    preemptible=bool(preemptible) or policy.preemptible,
                    cluster_ssh=cluster_keypair() if cluster_size > 1 else {},
                )
        except IntegrityError:  # a concurrent create with the same name won
            raise SessionRequestError(f"You already have a live session named {name!r}.",
                                      "name", status_code=409) from None
        Kernel.objects.bulk_create(
            Kernel(session=session, image=session.image, requested_slots=slots.to_json(),
                   cluster_role=Kernel.ClusterRole.MAIN if i == 0 else Kernel.ClusterRole.SUB,
                   cluster_idx=1 if i == 0 else i, status_history=queued)
            for i in range(cluster_size)
        )
        if dependencies:
            session.dependencies.set(dependencies)
        add_mounts(session, folders)
        engine.record_enqueued(session, actor=actor or user.get_username())
        transaction.on_commit(lambda: kick_scheduler(group.name))
    return session


def check_priority(priority, policy, may_raise):
    if priority is None:
        return policy.default_priority
    highest = policy.max_priority if may_raise else policy.default_priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
            0 <= priority <= highest):
        who = "" if may_raise else " (only an admin may set it higher)"
        raise SessionRequestError(
            f"priority must be a whole number from 0 to {highest}, the highest your resource "
            f"policy {policy.name!r} allows{who}.", "priority")
    return priority


class _DryRun(Exception):
    def __init__(self, answer):
        self.answer = answer


def dry_run_session(**fields) -> dict:
    """Where and when a session of create_session's `fields` would start, without creating
    it: the rows are made, the scheduler's dry run answers, and all is rolled back (the
    scheduler kick and the events go with the transaction)."""
    from scheduling_app.scheduler import dry_run

    try:
        with transaction.atomic():
            session = create_session(**fields)
            raise _DryRun(dry_run(session.scaling_group, session.pk))
    except _DryRun as done:
        return {"dry_run": True, **done.answer}


def cluster_keypair():
    """An SSH keypair for the kernels of one cluster session to reach one another."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return {"private": private, "public": public + " backendai-cluster\n"}


def kick_scheduler(scaling_group_name):
    send_task_safely("scheduling.schedule", queue="manager",
                     kwargs={"scaling_group_name": scaling_group_name})


def find_session(sessions, ref):
    """The session that `ref` names among `sessions`: by id; else by name, a live session
    first, else the most recent finished one. None when there is none."""
    try:
        session_id = uuid.UUID(str(ref))
    except ValueError:
        pass
    else:
        found = sessions.filter(pk=session_id).first()
        if found is not None:
            return found
    named = sessions.filter(name=ref)
    return (named.filter(status__in=LIVE_STATUSES).first()
            or named.order_by("-created_at").first())


@transaction.atomic
def rename_session(session, new_name, *, actor):
    """Give a live session a name that is unique among its owner's live sessions."""
    validate_name(new_name)
    current = Session.objects.select_for_update().get(pk=session.pk)
    if current.status in FINISHED_STATUSES:
        raise SessionRequestError(f"The session is {current.status}; only a live session can "
                                  "be renamed.", "name", status_code=409)
    old_name = current.name
    if new_name == old_name:
        return current
    taken = Session.objects.filter(keypair_id=current.keypair_id, name=new_name,
                                   status__in=LIVE_STATUSES).exists()
    try:
        with transaction.atomic():
            if taken:
                raise IntegrityError
            Session.objects.filter(pk=current.pk).update(name=new_name)
    except IntegrityError:  # the check above, or a concurrent rename or create
        raise SessionRequestError(f"You already have a live session named {new_name!r}.",
                                  "name", status_code=409) from None
    current.name = session.name = new_name
    engine.record_event(current, "session_renamed", actor=actor,
                        reason=f"renamed from {old_name}",
                        data={"from": old_name, "to": new_name})
    return current
