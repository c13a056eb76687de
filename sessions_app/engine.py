"""The state engine: the only code that changes the status of a kernel or a session.

Every change is a conditional UPDATE on the status the caller expects, under a row lock;
a caller that lost a race gets None back and changes nothing. Every change appends a
SessionEvent and, after commit, publishes one message to the channel layer. Accounting
that follows from a status (an agent's occupied slots, a keypair's concurrency) is kept
here too, so that no caller can forget it.
"""

import logging

from django.db import transaction
from django.db.models import F
from django.dispatch import Signal

from accounting_app import records as usage_records
from agents_app.models import Agent
from common import clock
from common.bulk import MergedJSON, insert_rows, set_json_key, update_rows
from common.slots import ResourceSlots, SlotsCache
from identity_app.models import KeyPair
from sessions_app import events as events_module
from sessions_app.enums import ClusterMode, Status, StatusGroup
from sessions_app.models import Kernel, Session, SessionEvent
from sessions_app.status_data import Key

log = logging.getLogger(__name__)

S = Status

# What follows from a change but is an agent's work is the lifecycle's (a layer above): the
# engine announces it, sessions_app.lifecycle.networks answers (connected at app loading).
# Placed across hosts, in the placing transaction: session_ids=[...].
sessions_spread = Signal()
# A session across hosts has ended, in the ending transaction: session=.
spread_session_ended = Signal()

# Allowed transitions, for kernels and (derived from them) sessions.
# PENDING is reachable again from the allocated states (a retry reschedules elsewhere) and
# from TERMINATING (a preempted batch session is re-queued). STOPPED comes from TERMINATING
# (a stop keeps the files) and from the way back to RUNNING (a resume that cannot restore
# them, or that waited past its pending timeout, leaves the session as it was).
_BACK_TO_STOPPED = {S.PENDING} | StatusGroup.STARTING
TRANSITIONS = {
    S.PENDING: {S.SCHEDULED, S.CANCELLED, S.ERROR, S.STOPPED},
    S.SCHEDULED: {S.PREPARING, S.PENDING, S.CANCELLED, S.TERMINATING, S.TERMINATED, S.ERROR,
                  S.STOPPED},
    S.PREPARING: {S.PULLING, S.PREPARED, S.PENDING, S.CANCELLED, S.TERMINATING, S.TERMINATED,
                  S.ERROR, S.STOPPED},
    S.PULLING: {S.PREPARED, S.PENDING, S.CANCELLED, S.TERMINATING, S.TERMINATED, S.ERROR,
                S.STOPPED},
    S.PREPARED: {S.CREATING, S.PENDING, S.CANCELLED, S.TERMINATING, S.TERMINATED, S.ERROR,
                 S.STOPPED},
    S.CREATING: {S.RUNNING, S.PENDING, S.CANCELLED, S.TERMINATING, S.TERMINATED, S.ERROR,
                 S.STOPPED},
    S.RUNNING: {S.TERMINATING, S.TERMINATED, S.ERROR},
    # PENDING again: a preempted batch session re-queued once its container is gone.
    S.TERMINATING: {S.TERMINATED, S.PENDING, S.ERROR, S.STOPPED},
    S.ERROR: {S.TERMINATING, S.TERMINATED},
    # Resumed (PENDING), or deleted with its kept files (TERMINATED).
    S.STOPPED: {S.PENDING, S.TERMINATED},
    S.TERMINATED: set(),
    S.CANCELLED: set(),
}

# A session is an aggregate: kernels placed one by one can leave it partly placed, and
# tearing such a session down goes from PENDING straight to TERMINATING or TERMINATED.
# A session whose kernels are cancelled one by one (a failure no retry fixes, before it
# ran) is TERMINATING between the first and the last, then CANCELLED; one whose stopped
# kernels are deleted one by one is TERMINATING between them.
SESSION_TRANSITIONS = {**TRANSITIONS,
                       S.PENDING: TRANSITIONS[S.PENDING] | {S.TERMINATING, S.TERMINATED},
                       S.TERMINATING: TRANSITIONS[S.TERMINATING] | {S.CANCELLED},
                       S.STOPPED: TRANSITIONS[S.STOPPED] | {S.TERMINATING}}

KERNEL_EVENT_NAMES = {
    S.PENDING: "kernel_pending",
    S.SCHEDULED: "kernel_scheduled",
    S.PREPARING: "kernel_preparing",
    S.PULLING: "kernel_pulling",
    S.PREPARED: "kernel_prepared",
    S.CREATING: "kernel_creating",
    S.RUNNING: "kernel_started",
    S.TERMINATING: "kernel_terminating",
    S.TERMINATED: "kernel_terminated",
    S.CANCELLED: "kernel_cancelled",
    S.ERROR: "kernel_error",
    S.STOPPED: "kernel_stopped",
}
SESSION_EVENT_NAMES = {
    S.PENDING: "session_enqueued",
    S.SCHEDULED: "session_scheduled",
    S.PREPARING: "session_preparing",
    S.PULLING: "session_pulling",
    S.PREPARED: "session_prepared",
    S.CREATING: "session_creating",
    S.RUNNING: "session_started",
    S.TERMINATING: "session_terminating",
    S.TERMINATED: "session_terminated",
    S.CANCELLED: "session_cancelled",
    S.ERROR: "session_error",
    S.STOPPED: "session_stopped",
}
# A stopped kernel is before PENDING: a session resumed kernel by kernel stays STOPPED until
# the last is PENDING, and one whose resume fails is STOPPED again from the first.
_PROGRESS = [S.STOPPED, S.PENDING, S.SCHEDULED, S.PREPARING, S.PULLING, S.PREPARED,
             S.CREATING, S.RUNNING]


class IllegalTransition(Exception):
    def __init__(self, obj, from_status, to_status):
        kind = type(obj).__name__.lower()
        super().__init__(f"A {kind} cannot go from {from_status} to {to_status}.")
        self.from_status, self.to_status = from_status, to_status


def check_transition(obj, from_status, to_status):
    table = SESSION_TRANSITIONS if isinstance(obj, Session) else TRANSITIONS
    if to_status not in table[Status(from_status)]:
        raise IllegalTransition(obj, from_status, to_status)


def derive_session_status(kernel_statuses):
    """A session's status from its kernels' statuses."""
    statuses = set(kernel_statuses)
    if not statuses:
        return S.PENDING
    if statuses <= StatusGroup.FINISHED:
        return S.CANCELLED if statuses == {S.CANCELLED} else S.TERMINATED
    if S.TERMINATING in statuses or statuses & StatusGroup.FINISHED:
        # Cancelled and still-PENDING kernels only: a pending session being cancelled, with
        # nothing to tear down. A TERMINATED kernel means the session had got further.
        if statuses - StatusGroup.FINISHED == {S.PENDING} and S.TERMINATED not in statuses:
            return S.PENDING
        return S.TERMINATING
    if S.ERROR in statuses:
        return S.ERROR
    return min(statuses, key=_PROGRESS.index)


def _record(session, kernel, name, from_status, to_status, reason, actor, data, now):
    _record_many(session, [(kernel, name, from_status, to_status, data)], reason, actor, now)


def _record_many(session, events, reason, actor, now):
    """Store (kernel or None, name, from status, to status, data) events of one session in
    one INSERT; publish them after commit."""
    ids = insert_rows(SessionEvent, ["session", "kernel", "name", "from_status", "to_status",
                                     "reason", "actor", "data", "created_at"],
                      [(session.pk, kernel.pk if kernel else None, name, from_status or "",
                        to_status or "", reason, actor, data or {}, now)
                       for kernel, name, from_status, to_status, data in events],
                      returning="id")
    agent_id = next((k.agent_id for k, *_ in events if k is not None), None)
    events_module.publish_many_on_commit([
        (session, name, {"kernel_id": kernel.pk if kernel else None, "status": to_status,
                         "previous_status": from_status, "reason": reason, "at": now,
                         "data": data, "event_id": event_id, "agent_id": agent_id,
                         "cluster_role": kernel.cluster_role if kernel else None,
                         "cluster_idx": kernel.cluster_idx if kernel else None})
        for (kernel, name, from_status, to_status, data), event_id in zip(events, ids,
                                                                           strict=True)])


def record_event(session, name, *, kernel=None, reason="", actor="system", data=None):
    """An event that changes no status (progress, health, batch result)."""
    _record(session, kernel, name, session.status if kernel is None else kernel.status,
            session.status if kernel is None else kernel.status, reason, actor, data, clock.now())


def record_enqueued(session, *, actor):
    _record(session, None, SESSION_EVENT_NAMES[S.PENDING], "", S.PENDING, "", actor, None,
            session.created_at)


def transition_kernel(kernel, to_status, *, via=(), reason="", actor="system",
                      from_statuses=None, data=None, status_data=None,
                      clear_status_data=False, **fields):
    """Move one kernel to `to_status`; None when it was no longer in `from_statuses`.

    `from_statuses` defaults to the status the caller last saw. `via`: statuses passed
    through on the way, each recorded as a step of its own (history, events, the
    session's status), in the same single write. `status_data`: keys (status_data.Key) to
    set, the others kept as the locked row has them; `clear_status_data` starts it afresh.
    `fields` are other kernel columns to set in the same UPDATE (container_id, agent, ...).
    """
    if clear_status_data or status_data is not None:
        fields["status_data"] = (clear_status_data, _named(status_data or {}))
    from_statuses = set(from_statuses or {kernel.status})
    steps = [*via, to_status]
    for from_status in from_statuses:  # before any write: the caller's transaction goes on
        for before, after in zip([from_status, *steps], steps, strict=False):
            check_transition(kernel, before, after)
    # No savepoint: every transition is on the path of a session's start, and a failure
    # past this point is a database error that ends the caller's transaction anyway.
    with transaction.atomic(savepoint=False):
        return _transition_kernel(kernel, steps, reason, actor, from_statuses, data, fields)


def _transition_kernel(kernel, steps, reason, actor, from_statuses, data, fields):
    current = Kernel.objects.select_for_update().filter(pk=kernel.pk).first()
    if current is None or current.status not in from_statuses:
        return None
    now = clock.now()
    from_status, to_status = current.status, steps[-1]
    values = {
        "status": to_status,
        "status_info": reason,
        "status_changed": now,
        "status_history": {**current.status_history, **dict.fromkeys(steps, now.isoformat())},
        **fields,
    }
    if "status_data" in fields:  # read under the row lock: no other writer's key is lost
        cleared, changes = fields["status_data"]
        values["status_data"] = {**({} if cleared else current.status_data), **changes}
    if to_status in StatusGroup.FINISHED:
        values["terminated_at"] = now
    updated = Kernel.objects.filter(pk=kernel.pk, status=from_status).update(**values)
    if not updated:
        return None
    held_on = current.agent_id  # the agent whose slots it held before this update
    for name, value in values.items():
        setattr(current, name, value)
    _account_kernel(current, held_on, from_status, to_status)
    # The session is locked after its kernel, as everywhere, and read once.
    session = current.session = Session.objects.select_for_update().get(pk=current.session_id)
    usage_records.kernel_moved(current, session, from_status, to_status, now)
    events = _follow(session, current, from_status, steps, data, reason, now)
    _record_many(session, events, reason, actor, now)
    for name, value in values.items():
        setattr(kernel, name, value)
    return current


def _follow(session, kernel, from_status, steps, data, reason, now):
    """The session follows its kernel's steps: its status is derived from its kernels'
    after each step, and written once. Returns the events of both, step by step."""
    # A session of one kernel has no other kernels to read.
    others = [] if session.cluster_size == 1 else list(
        session.kernels.exclude(pk=kernel.pk).values_list("status", flat=True))
    events, previous = [], from_status
    original = status = session.status
    history = dict(session.status_history)
    for step in steps:
        events.append((kernel, KERNEL_EVENT_NAMES[step], previous, step, data))
        previous = step
        derived = derive_session_status([*others, step])
        if derived != status:
            check_transition(session, status, derived)
            events.append((None, SESSION_EVENT_NAMES[derived], status, derived, None))
            history[derived] = now.isoformat()
            status = derived
    if status != original:
        _write_session_status(session, original, status, history, reason, now)
    return events


def _write_session_status(session, from_status, to_status, history, reason, now):
    values = {"status": to_status, "status_info": reason, "status_changed": now,
              "status_history": history}
    if to_status == S.RUNNING and session.starts_at is None:
        values["starts_at"] = now
    if to_status in StatusGroup.FINISHED:
        values["terminated_at"] = now
        if session.cluster_size > 1 and session.cluster_mode == ClusterMode.MULTI_NODE:
            spread_session_ended.send(sender=Session, session=session)
    Session.objects.filter(pk=session.pk, status=from_status).update(**values)  # locked
    for name, value in values.items():
        setattr(session, name, value)


def _account_kernel(kernel, held_on, from_status, to_status):
    holding = StatusGroup.HOLDING_SLOTS
    if held_on and from_status in holding and to_status not in holding:
        release_agent_slots(held_on, kernel.occupied_slots)
    if kernel.is_main:
        held_before = from_status in StatusGroup.HOLDING_CONCURRENCY
        held_after = to_status in StatusGroup.HOLDING_CONCURRENCY
        keypair_id = Session.objects.filter(pk=kernel.session_id).values_list("keypair_id")
        if held_after and not held_before:
            _keypairs(keypair_id).update(concurrency_used=F("concurrency_used") + 1)
        elif held_before and not held_after:
            _keypairs(keypair_id).filter(concurrency_used__gt=0).update(
                concurrency_used=F("concurrency_used") - 1
            )


def _keypairs(keypair_id_query):
    return KeyPair.objects.filter(pk__in=keypair_id_query)


def release_agent_slots(agent_id, slots):
    agent = Agent.objects.select_for_update(no_key=True).filter(pk=agent_id).first()
    if agent is None:
        return
    occupied = ResourceSlots.parse(agent.occupied_slots) - ResourceSlots.parse(slots)
    agent.occupied_slots = occupied.clamp_negative().to_json()
    agent.save(update_fields=["occupied_slots"])


@transaction.atomic
def schedule_kernel(kernel, agent, *, reason="", actor="scheduler"):
    """PENDING → SCHEDULED on `agent`, adding the kernel's slots to the agent's occupancy.

    The caller holds the agent row lock and has checked capacity.
    """
    slots = ResourceSlots.parse(kernel.requested_slots)
    moved = transition_kernel(
        kernel, S.SCHEDULED, reason=reason, actor=actor, agent=agent, agent_addr=agent.addr,
        occupied_slots=slots.to_json(),
    )
    if moved:
        agent.occupied_slots = (ResourceSlots.parse(agent.occupied_slots) + slots).to_json()
        agent.save(update_fields=["occupied_slots"])
    return moved


def _named(changes):
    """status_data changes by their registered names; an unknown key is a bug."""
    return {Key(key).value: value for key, value in changes.items()}


def merge_status_data(row, changes, remove=()):
    """Set the keys of `changes` (status_data.Key) in a kernel's or session's status_data,
    take the `remove` keys out, and keep the rest as the database has it, in one UPDATE: a
    writer whose copy is old cannot undo a key set meanwhile (no read-modify-write)."""
    changes, remove = _named(changes), list(_named(dict.fromkeys(remove)))
    type(row).objects.filter(pk=row.pk).update(
        status_data=MergedJSON("status_data", changes, remove))
    row.status_data = {key: value for key, value in {**row.status_data, **changes}.items()
                       if key not in remove}


@transaction.atomic
def set_kernel_data(kernel, **fields):
    """Write non-status columns (log_tail, exit_code) without touching the status; status_data
    only through merge_status_data."""
    assert "status_data" not in fields, "status_data: use merge_status_data"
    Kernel.objects.filter(pk=kernel.pk).update(**fields)
    for name, value in fields.items():
        setattr(kernel, name, value)


# Named transitions, in the words of the lifecycle.

def mark_kernel_preparing(kernel, **kw):
    return transition_kernel(kernel, S.PREPARING, **kw)


def mark_kernel_pulling(kernel, *, progress=None, **kw):
    return transition_kernel(kernel, S.PULLING, from_statuses={S.PREPARING}, data=progress, **kw)


def mark_kernel_prepared(kernel, **kw):
    return transition_kernel(kernel, S.PREPARED, from_statuses={S.PREPARING, S.PULLING}, **kw)


def mark_kernel_prepared_and_creating(kernel, **kw):
    """The image of a session's only kernel is ready: it is started at once, PREPARED and
    CREATING recorded as two steps of one write."""
    return transition_kernel(kernel, S.CREATING, via=(S.PREPARED,),
                             from_statuses={S.PREPARING, S.PULLING}, **kw)


def mark_kernel_creating(kernel, **kw):
    return transition_kernel(kernel, S.CREATING, from_statuses={S.PREPARED}, **kw)


def mark_kernel_running(kernel, creation_info, **kw):
    """RUNNING, with its container and the devices its agent allocated it (they replace
    the scheduler's plan)."""
    devices = creation_info.get("device_allocation")
    return transition_kernel(
        kernel, S.RUNNING, from_statuses={S.CREATING},
        container_id=creation_info.get("container_id", ""), data=creation_info,
        **({"device_allocation": devices} if isinstance(devices, dict) and devices else {}),
        **kw,
    )


def mark_kernel_cancelled(kernel, *, reason, **kw):
    return transition_kernel(kernel, S.CANCELLED, reason=reason, **kw)


def mark_kernel_terminating(kernel, *, reason, **kw):
    return transition_kernel(kernel, S.TERMINATING, reason=reason, **kw)


def mark_kernel_terminated(kernel, *, reason, exit_code=None, from_statuses=None, **kw):
    return transition_kernel(
        kernel, S.TERMINATED, reason=reason, exit_code=exit_code,
        from_statuses=from_statuses or (StatusGroup.LIVE - {S.PENDING}), **kw,
    )


def mark_kernel_error(kernel, *, reason, **kw):
    return transition_kernel(kernel, S.ERROR, reason=reason, **kw)


@transaction.atomic
def set_session_data(session, **fields):
    """Write non-status session columns (occupying_slots); status_data only through
    merge_status_data."""
    assert "status_data" not in fields, "status_data: use merge_status_data"
    Session.objects.filter(pk=session.pk).update(**fields)
    for name, value in fields.items():
        setattr(session, name, value)


@transaction.atomic
def schedule_sessions(placements, *, actor="scheduler", check_image=None, allocations=None):
    """The allocator's write: PENDING → SCHEDULED for many sessions in one transaction.

    `placements` is a list of (session id, {kernel id: agent id}). Agents and kernels are
    locked and re-read; a session whose kernels are no longer all PENDING, or that no
    longer fits its agents' fresh free slots, is left out. Returns the placed session ids.
    With `check_image` (a function of a kernel), the kernels go on to PREPARING in the
    same write, both steps recorded, and check_image(kernel) follows the commit.
    `allocations`: {kernel id: the devices planned for it}, kept on the kernels (the
    agent takes the plan when those devices are free there; common/devices.py).
    """
    allocations = allocations or {}
    if not placements:
        return []
    slots_of = SlotsCache()  # a pass sees few distinct sizes and occupancies
    agent_ids = sorted({a for _, placement in placements for a in placement.values()})
    # Only the columns the allocator needs: a dispersed pass locks thousands of agents.
    agents = {row[0]: row for row in Agent.objects.select_for_update(no_key=True)
              .filter(pk__in=agent_ids)
              .order_by("pk").values_list("id", "addr", "available_slots", "occupied_slots")}
    free = {pk: slots_of(available) - slots_of(occupied)
            for pk, _, available, occupied in agents.values()}
    kernel_rows = {
        row[0]: row for row in Kernel.objects.select_for_update()
        .filter(session_id__in=[sid for sid, _ in placements], status=S.PENDING)
        .values_list("id", "session_id", "requested_slots", "status_history", "image",
                     "cluster_role", "cluster_idx")
    }
    session_rows = {
        row[0]: row for row in Session.objects.select_for_update()
        .filter(pk__in=[sid for sid, _ in placements], status=S.PENDING)
        .values_list("id", "name", "user_id", "keypair_id", "status_history", "domain_id",
                     "project_id")
    }
    placed, kernel_updates, occupying = [], [], {}
    occupied = {}
    for session_id, placement in placements:
        if session_id not in session_rows or any(kid not in kernel_rows for kid in placement):
            continue  # cancelled or changed since the snapshot
        need = {}
        for kernel_id, agent_id in placement.items():
            need[agent_id] = need.get(agent_id, ResourceSlots()) + slots_of(
                kernel_rows[kernel_id][2])
        if any(a not in free or not n.fits_in(free[a]) for a, n in need.items()):
            continue  # the agent changed since the snapshot: next pass
        total = ResourceSlots()
        for agent_id, slots in need.items():
            free[agent_id] = free[agent_id] - slots
            occupied[agent_id] = occupied.get(agent_id, slots_of(agents[agent_id][3])) + slots
            total = total + slots
        occupying[session_id] = total.to_json()
        kernel_updates += [(kernel_id, agent_id) for kernel_id, agent_id in placement.items()]
        placed.append(session_id)
    if not placed:
        return []

    now = clock.now()
    steps = [S.SCHEDULED, S.PREPARING] if check_image else [S.SCHEDULED]
    status = steps[-1]
    stamp = dict.fromkeys(steps, now.isoformat())
    # The kernels are locked and PENDING (checked above): one bulk UPDATE writes them all.
    update_rows(Kernel, ["status", "status_info", "status_changed", "agent", "agent_addr",
                         "occupied_slots", "status_history", "device_allocation"], [
        (kernel_id, status, "", now, agent_id, agents[agent_id][1],
         kernel_rows[kernel_id][2], {**kernel_rows[kernel_id][3], **stamp},
         allocations.get(kernel_id, {}))
        for kernel_id, agent_id in kernel_updates
    ])
    update_rows(Agent, ["occupied_slots"],
                [(agent_id, slots.to_json()) for agent_id, slots in occupied.items()])
    update_rows(Session, ["status", "status_info", "status_changed", "status_history",
                          "occupying_slots"], [
        (session_id, status, "", now, {**session_rows[session_id][4], **stamp},
         occupying[session_id])
        for session_id in placed
    ])
    sessions, per_keypair = {}, {}
    for session_id in placed:
        _, name, user_id, keypair_id, _, domain_id, project_id = session_rows[session_id]
        sessions[session_id] = _SessionRef(session_id, name, user_id, keypair_id, domain_id,
                                           project_id)
        per_keypair[keypair_id] = per_keypair.get(keypair_id, 0) + 1
    keypairs = list(KeyPair.objects.select_for_update().filter(pk__in=per_keypair))
    for keypair in keypairs:
        keypair.concurrency_used += per_keypair[keypair.pk]
    update_rows(KeyPair, ["concurrency_used"], [(k.pk, k.concurrency_used) for k in keypairs])

    events = []  # (session id, kernel id, name, from, to), step by step
    for before, step in zip([S.PENDING, *steps], steps, strict=False):
        events += [(kernel_rows[kernel_id][1], kernel_id, KERNEL_EVENT_NAMES[step], before, step)
                   for kernel_id, _ in kernel_updates]
        events += [(session_id, None, SESSION_EVENT_NAMES[step], before, step)
                   for session_id in placed]
    ids = insert_rows(SessionEvent, ["session", "kernel", "name", "from_status", "to_status",
                                     "reason", "actor", "data", "created_at"],
                      [(sid, kid, name, before, step, "", actor, {}, now)
                       for sid, kid, name, before, step in events], returning="id")
    agent_of = dict(kernel_updates)
    session_agent = {kernel_rows[kid][1]: agent_id for kid, agent_id in kernel_updates}
    events_module.publish_many_on_commit(
        [(sessions[sid], name, {"kernel_id": kid, "status": step, "previous_status": before,
                                "reason": "", "at": now, "event_id": event_id,
                                "agent_id": agent_of[kid] if kid else session_agent[sid],
                                "cluster_role": kernel_rows[kid][5] if kid else None,
                                "cluster_idx": kernel_rows[kid][6] if kid else None})
         for (sid, kid, name, before, step), event_id in zip(events, ids, strict=True)])
    if check_image:
        kernels = [_KernelRef(kernel_id, agent_id, kernel_rows[kernel_id][4])
                   for kernel_id, agent_id in kernel_updates]

        def check_images():
            for kernel in kernels:
                check_image(kernel)

        transaction.on_commit(check_images)
    placed_ids = set(placed)
    spread = [sid for sid, placement in placements
              if sid in placed_ids and len(set(placement.values())) > 1]
    if spread:
        sessions_spread.send(sender=Session, session_ids=spread)
    return placed


class _KernelRef:
    """What an agent call about a kernel's image needs of it."""

    __slots__ = ("pk", "agent_id", "image")

    def __init__(self, pk, agent_id, image):
        self.pk, self.agent_id, self.image = pk, agent_id, image


class _SessionRef:
    """What a published message needs of a session."""

    __slots__ = ("pk", "name", "user_id", "keypair_id", "domain_id", "project_id")

    def __init__(self, pk, name, user_id, keypair_id, domain_id, project_id):
        self.pk, self.name, self.user_id = pk, name, user_id
        self.keypair_id, self.domain_id, self.project_id = keypair_id, domain_id, project_id


def set_pending_reasons(rows):
    """Bulk write of (session id, the scheduler's record) into status_data["scheduler"] of
    sessions still PENDING, in one statement; the rest of status_data stays as it is."""
    set_json_key(Session, "status_data", "scheduler", rows,
                 where={"status": Status.PENDING.value})


def record_activity_check(uses, now):
    """The idle pass's record: each session's last activity of any kind, (session id,
    time) rows, written only where newer (an owner's touch meanwhile is kept), and the
    time of the check on every RUNNING session; two statements."""
    update_rows(Session, ["last_activity"], list(uses), advance=True)
    Session.objects.filter(status=Status.RUNNING).update(last_activity_check=now)


def set_idle_checks(rows):
    """Bulk write of (session id, reports) into status_data["idle_checks"] of sessions
    still RUNNING, in one statement; the rest of status_data stays as it is."""
    set_json_key(Session, "status_data", "idle_checks", rows,
                 where={"status": Status.RUNNING.value})
