"""The browser dashboard: server-rendered pages; static/js keeps them live over /ws/events/.

Each view is thin: it finds what the user may see and calls the same services, lifecycle
and engine code as the API.
"""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from agents_app.models import Agent, AgentStatus
from common import clock
from common.slots import ResourceSlots, format_bytes
from identity_app.acting import actor_of
from scheduling_app.scheduler.outlook import queue_outlook
from sessions_app import series, service_ports
from sessions_app.enums import Status, StatusGroup
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.heartbeats import is_uuid
from sessions_app.lifecycle.stop import (
    ResumeRefused,
    StopRefused,
    kept_bytes_of,
    resume_session,
    stop_session,
)
from sessions_app.models import Kernel, Session
from sessions_app.querysets import may_force_terminate
from sessions_app.spec import DestroyRefused
from sessions_app.web import timeline
from sessions_app.web.forms import SessionForm

LIST_LIMIT = 200
# The session page's utilization charts (static/js/session_charts.js draws them).
CHART_TITLES = (("cpu", "CPU (% of one core)"), ("mem", "Memory"),
                ("net", "Network (in / out per second)"),
                ("disk", "Disk (read / write per second)"), ("device", "Devices (utilization %)"))
# Sent by static/js/live.js's refresher when a page re-reads itself.


def viewer(request):
    """The keypair a browser request acts through, and whether it sees every session."""
    actor = actor_of(request)
    return actor.keypair, actor.is_admin


def visible_session(request, pk):
    sessions = Session.objects.select_related("user", "scaling_group").restrict(
        actor_of(request))
    try:
        return sessions.prefetch_related("kernels__agent").get(pk=pk)
    except (Session.DoesNotExist, ValidationError):  # another user's session is not there
        raise Http404("Session not found.") from None


@login_required
def session_list(request):
    keypair, admin = viewer(request)
    scope = "all" if admin and request.GET.get("scope") == "all" else "mine"
    tab = request.GET.get("tab") if request.GET.get("tab") in ("finished", "stopped") \
        else "live"
    sessions = Session.objects.select_related("user").prefetch_related("kernels__agent")
    sessions = sessions.filter(user=request.user) if scope == "mine" else sessions.restrict(
        actor_of(request))
    finished, stopped = sessions.finished(), sessions.filter(status=Status.STOPPED)
    live = sessions.live().exclude(status=Status.STOPPED)
    shown = {"finished": finished.order_by("-terminated_at", "-created_at"),
             "stopped": stopped.order_by("-status_changed"), "live": live}[tab]
    return render(request, "dashboard/session_list.html", {
        "sessions": shown[:LIST_LIMIT], "tab": tab, "scope": scope, "admin": admin,
        "may_force": may_force_terminate(request.user),
        "counts": {"live": live.count(), "stopped": stopped.count(),
                   "finished": finished.count()},
        "kept": kept_bytes_of(request.user.pk), "quota": keypair.resource_policy.storage_quota,
        "limit": LIST_LIMIT, "rendered_at": clock.now(),
    })


@login_required
def session_create(request):
    keypair, admin = viewer(request)
    form = SessionForm(request.POST or None, keypair=keypair, may_raise_priority=admin)
    if request.method != "POST":
        form.start_from(request.GET.get("template"))
    if request.method == "POST" and form.is_valid():
        session = form.save(request.user)
        if session is not None:
            messages.success(request, f"Session {session.name} is queued.")
            return redirect("dashboard:session-detail", pk=session.pk)
    return render(request, "dashboard/session_form.html", {"form": form, "admin": admin,
                                                            "quota": form.quota})


@login_required
def session_detail(request, pk):
    session = visible_session(request, pk)
    # Looking at a session is not using it (activity.py): the page touches nothing.
    _, admin = viewer(request)
    events = list(session.events.select_related("kernel").order_by("created_at", "id"))
    now = clock.now()
    idle_state, idle_checks = timeline.idle_checks(session, now)
    return render(request, "dashboard/session_detail.html", {
        "session": session, "admin": admin, "events": events,
        "may_force": may_force_terminate(request.user),
        "kernels": session.kernels.select_related("agent"), "phases": timeline.phases(events),
        "progress": timeline.start_progress(session),
        "finished": session.status in StatusGroup.FINISHED, "rendered_at": now,
        "idle_state": idle_state, "idle_checks": idle_checks,
        "idle_warning": min((c for c in idle_checks if c.warned and c.remaining is not None),
                            key=lambda c: c.remaining, default=None),
        "idle_check_interval": settings.IDLE_CHECK_INTERVAL,
        "services": service_ports.of_image(session.image),
        "chart_titles": CHART_TITLES,
        "kept_bytes": sum(int((k.kept or {}).get("bytes") or 0)
                          for k in session.kernels.all()),
    })


@login_required
@require_POST
def session_terminate(request, pk):
    session = visible_session(request, pk)
    keypair, _ = viewer(request)
    forced = request.POST.get("forced") == "true"
    try:
        result = destroy_session(session, forced=forced, actor=request.user, keypair=keypair)
    except DestroyRefused as exc:
        messages.error(request, f"Session {session.name} was not terminated: {exc.message}.")
    else:
        verb = "Force-terminated" if forced else "Terminating"
        messages.success(request, f"{verb} session {session.name}: it is {result.status} now.")
    next_url = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(next_url, {request.get_host()},
                                           request.is_secure()):
        next_url = reverse("dashboard:session-detail", args=[session.pk])
    return redirect(next_url)


def _back_to(request, session):
    next_url = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(next_url, {request.get_host()},
                                           request.is_secure()):
        next_url = reverse("dashboard:session-detail", args=[session.pk])
    return redirect(next_url)


@login_required
@require_POST
def session_stop(request, pk):
    session = visible_session(request, pk)
    keypair, _ = viewer(request)
    try:
        stop_session(session, actor=request.user, keypair=keypair)
    except StopRefused as exc:
        messages.error(request, f"Session {session.name} was not stopped: {exc.message}")
    else:
        messages.success(request, f"Stopping session {session.name}: its files are kept, "
                                  "resume it when you need it again.")
    return _back_to(request, session)


@login_required
@require_POST
def session_resume(request, pk):
    session = visible_session(request, pk)
    keypair, _ = viewer(request)
    try:
        resume_session(session, actor=request.user, keypair=keypair)
    except ResumeRefused as exc:
        messages.error(request, f"Session {session.name} was not resumed: {exc.message}")
    else:
        messages.success(request, f"Session {session.name} is queued to resume.")
    return _back_to(request, session)


@login_required
def overview(request):
    _, admin = viewer(request)
    if not admin:
        raise PermissionDenied("The overview is for operators.")
    by_status = dict(Session.objects.live()
                     .values_list("status").annotate(n=Count("id")).order_by())
    agents = sorted(Agent.objects.select_related("scaling_group"),
                    key=lambda a: (a.status != AgentStatus.LOST, a.status, a.id))
    holders = session_names_of(agents)
    occupancy = series.occupancy_series(hours=24)
    return render(request, "dashboard/overview.html", {
        "admin": admin, "rendered_at": clock.now(),
        "statuses": [(status, by_status.get(status, 0)) for status in Status
                     if status not in StatusGroup.FINISHED],
        "agents": [(agent, slot_bars(agent), device_rows(agent, holders)) for agent in agents],
        "occupancy": occupancy_table(occupancy), "occupancy_series": occupancy,
    })


def occupancy_table(occupancy):
    """[(group, used, reserved, free)] of each scaling group's latest sample."""
    return [(group, data["used"][-1], data["reserved"][-1], data["free"][-1])
            for group, data in sorted(occupancy["groups"].items()) if data["t"]]


def session_names_of(agents):
    """{kernel id: its session's name} of the kernels holding the agents' devices."""
    ids = {held["kernel_id"] for agent in agents for device in agent.devices or []
           for held in device.get("held") or []}
    return {str(pk): name for pk, name in Kernel.objects.filter(pk__in=[
        i for i in ids if is_uuid(i)]).values_list("pk", "session__name")}


def device_rows(agent, holders):
    """Each device an agent reported: what it is, its use as measured, who holds it."""
    rows = []
    for device in agent.devices or []:
        used, total = device.get("mem_used"), device.get("mem_total") or device.get("memory")
        rows.append({
            "name": f"{device.get('kind')} {device.get('id')}",
            "model": device.get("model", ""), "plugin": device.get("plugin", ""),
            "utilization": device.get("utilization"),
            "memory": f"{format_bytes(used)} / {format_bytes(total)}"
                      if used is not None and total else "",
            "held": [f"{holders.get(h['kernel_id'], h['kernel_id'][:8])}"
                     + ("" if h["slot"].endswith(".device") else f" ({h['amount']})")
                     for h in device.get("held") or []]})
    return rows


def slot_bars(agent):
    """One bar per slot the agent offers: occupied of available."""
    available = ResourceSlots.parse(agent.available_slots)
    occupied = ResourceSlots.parse(agent.occupied_slots)
    bars = []
    for name, capacity in sorted(available.items()):
        used = occupied.get(name, 0)
        show = format_bytes if name == "mem" else str
        bars.append({"name": name, "label": f"{show(used)} / {show(capacity)}",
                     "percent": min(round(100 * used / capacity), 100) if capacity else 0})
    return bars


@login_required
def queue(request):
    """Each scaling group's waiting sessions at their predicted starts, beside the latest
    ends of the sessions holding slots (a user sees only their own sessions' names)."""
    _, admin = viewer(request)
    now = clock.now()
    groups = queue_outlook(actor_of(request), now)
    return render(request, "dashboard/queue.html", {
        "admin": admin, "rendered_at": now, "groups": groups,
        "queue_data": {"now": now.timestamp(), "groups": groups}})
