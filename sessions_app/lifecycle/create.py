"""Creating sessions: a validated SessionSpec (sessions_app/spec.py), then the PENDING rows,
then a scheduler kick."""


from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import IntegrityError, transaction

from common import clock
from identity_app import audit
from scheduling_app.scheduler import dry_run, kicks
from sessions_app import engine
from sessions_app.enums import Status, StatusGroup
from sessions_app.manager_state import check_not_frozen
from sessions_app.models import Kernel, Session
from sessions_app.spec import SessionRequestError, SessionSpec, check_priority, validate_name
from storage_app.folders import add_mounts


def create_session(*, keypair, user, actor=None, may_raise_priority=False, **fields) -> Session:
    """A session of `fields` (SessionSpec.build's) for `keypair`, asked by `actor` (default
    its user); SessionRequestError when the fields or the policy refuse it."""
    try:
        spec = SessionSpec.build(keypair=keypair, may_raise_priority=may_raise_priority,
                                 **fields)
    except Exception as exc:
        audit.record("session.create", result=audit.result_of(exc), target_type="session",
                     on_behalf_of=keypair.access_key, message=getattr(exc, "message", exc),
                     data={"name": fields.get("name") or ""})
        raise
    return create_from_spec(spec, keypair=keypair, user=user, actor=actor)


def create_from_spec(spec, *, keypair, user, actor=None) -> Session:
    """The PENDING rows of a validated spec, then (after commit) a scheduler kick. The
    policy's pending-session limit and the live-name rule are checked here, in the same
    transaction as the rows."""
    with audit.audited("session.create", target_type="session",
                       on_behalf_of=keypair.access_key, data={"name": spec.name}) as entry:
        session = _create_from_spec(spec, keypair=keypair, user=user, actor=actor)
        entry["target_id"] = session.pk
    return session


def _create_from_spec(spec, *, keypair, user, actor=None) -> Session:
    check_not_frozen()
    policy = keypair.resource_policy
    with transaction.atomic():
        if policy.max_pending_session_count is not None:
            pending = Session.objects.filter(keypair=keypair, status=Status.PENDING).count()
            if pending >= policy.max_pending_session_count:
                raise SessionRequestError(
                    f"You have {pending} pending sessions, the most your resource policy "
                    f"{policy.name!r} allows; wait for one to start or cancel one.",
                    status_code=429,
                )
        if Session.objects.filter(keypair=keypair, name=spec.name).live().exists():
            raise SessionRequestError(f"You already have a live session named {spec.name!r}.",
                                      "name", status_code=409)
        now = clock.now()
        queued = {Status.PENDING: now.isoformat()}
        slots = spec.slots.to_json()
        try:
            with transaction.atomic():
                session = Session.objects.create(
                    name=spec.name, keypair=keypair, user=user, domain=spec.project.domain,
                    project=spec.project, session_type=spec.session_type,
                    cluster_mode=spec.cluster_mode, cluster_size=spec.cluster_size,
                    image=spec.image, requested_slots=slots, scaling_group=spec.scaling_group,
                    startup_command=spec.startup_command, grace_period=spec.grace_period,
                    bootstrap_script=spec.bootstrap_script, environ=spec.environ,
                    batch_timeout=spec.batch_timeout, tag=spec.tag, status_history=queued,
                    pre_stop_command=spec.pre_stop_command, priority=spec.priority,
                    preemptible=spec.preemptible, not_before=spec.not_before,
                    designated_agents=list(spec.designated_agents),
                    status_data=waiting_for_start(spec.not_before, now),
                    cluster_ssh=cluster_keypair() if spec.cluster_size > 1 else {},
                )
        except IntegrityError:  # a concurrent create with the same name won
            raise SessionRequestError(f"You already have a live session named {spec.name!r}.",
                                      "name", status_code=409) from None
        Kernel.objects.bulk_create(
            Kernel(session=session, image=session.image, requested_slots=slots,
                   cluster_role=Kernel.ClusterRole.MAIN if i == 0 else Kernel.ClusterRole.SUB,
                   cluster_idx=1 if i == 0 else i, status_history=queued)
            for i in range(spec.cluster_size)
        )
        if spec.dependencies:
            session.dependencies.set(spec.dependencies)
        add_mounts(session, spec.mounts)
        engine.record_enqueued(session, actor=actor or user.get_username())
        group_name = spec.scaling_group.name
        transaction.on_commit(lambda: kicks.kick(group_name))
    return session


def waiting_for_start(not_before, now):
    """The status data of a session asked to start later: why it waits, which the
    scheduler's passes, which leave it out until then, do not write."""
    if not_before is None or not_before <= now:
        return {}
    return {"scheduler": {"failed_predicates": [{
        "name": "reserved_time",
        "msg": f"asked to start at {not_before.isoformat()} (starts_at)"}]}}


class _DryRun(Exception):
    def __init__(self, answer):
        self.answer = answer


def dry_run_session(**fields) -> dict:
    """Where and when a session of create_session's `fields` would start, without creating
    it: the rows are made, the scheduler's dry run answers, and all is rolled back (the
    scheduler kick and the events go with the transaction)."""
    try:
        with transaction.atomic():
            session = create_session(**fields)
            raise _DryRun(dry_run(session.scaling_group, session.pk))
    except _DryRun as done:
        return {"dry_run": True, **done.answer}


def cluster_keypair():
    """An SSH keypair for the kernels of one cluster session to reach one another."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return {"private": private, "public": public + " backendai-cluster\n"}


@transaction.atomic
def rename_session(session, new_name, *, actor):
    """Give a live session a name that is unique among its owner's live sessions."""
    validate_name(new_name)
    current = Session.objects.select_for_update().get(pk=session.pk)
    if current.status in StatusGroup.FINISHED:
        raise SessionRequestError(f"The session is {current.status}; only a live session can "
                                  "be renamed.", "name", status_code=409)
    old_name = current.name
    if new_name == old_name:
        return current
    taken = Session.objects.filter(keypair_id=current.keypair_id, name=new_name).live().exists()
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


@transaction.atomic
def change_priority(session, priority, *, actor, may_raise=False):
    """A new priority within its owner's policy (up to its default for users, its maximum
    for admins: `may_raise`); it orders the queue while the session is PENDING."""
    current = Session.objects.select_for_update().select_related(
        "keypair__resource_policy").get(pk=session.pk)
    priority = check_priority(priority, current.keypair.resource_policy, may_raise)
    if priority != current.priority:
        Session.objects.filter(pk=current.pk).update(priority=priority)
        engine.record_event(current, "session_priority_changed", actor=actor,
                            reason=f"priority {current.priority} → {priority}",
                            data={"from": current.priority, "to": priority})
    current.priority = session.priority = priority
    return current
