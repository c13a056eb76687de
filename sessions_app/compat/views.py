"""The REST routes of the Backend.AI manager (API v8.20240915) at the server root, as the
Backend.AI client SDK and its `backend.ai` CLI call them.

Thin translations: each view reads the SDK's request shape, calls the same services as
the DRF API (create_session, destroy_session, the agent tools, the engine's events) and
answers in the SDK's response shape. Errors are Backend.AI's `{"type", "title", "msg"}`.
"""

import functools
import shlex
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aiohttp import ClientError
from asgiref.sync import sync_to_async
from django.db.models import Q
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app import stream_tokens
from agents_app.models import Image
from agents_app.runtime import python_query
from common import clock
from identity_app.api.permissions import acting_keypair, owner_keypair, request_is_admin
from identity_app.models import Domain, Project, default_project
from scheduling_app.idle import checks_of as idle_checks_of
from sessions_app import activity, commits, service_ports
from sessions_app.api.errors import RequestFailed
from sessions_app.api.views import (
    create_for,
    destroy_for,
    is_true,
    rename_for,
    resolve_dependencies,
    visible_sessions,
)
from sessions_app.enums import SessionType, Status, StatusGroup
from sessions_app.events import ADMINS_GROUP, session_group, user_group
from sessions_app.lifecycle.stop import resume_session, stop_session
from sessions_app.models import BackgroundTask, Session
from sessions_app.querysets import as_uuid
from sessions_app.realtime import access
from sessions_app.realtime.agent_client import client
from sessions_app.realtime.streams import (
    KEEPALIVE_SECONDS,
    RECHECK_SECONDS,
    history_messages,
    message_key,
    next_message,
    sse,
    subscription,
    wait_until_finished,
    wait_until_started,
)
from sessions_app.spec import DestroyRefused
from sessions_app.tools import restart_session, running_main_kernel, session_logs

RUNTIME_PATH_LABEL = "ai.backend.runtime-path"
RUNTIME_TYPE_LABEL = "ai.backend.runtime-type"
EXECUTE_TIMEOUT = 300  # seconds a query or batch run may take
# How long a run's output is gathered into one result, as Backend.AI's manager asks its
# agent: 2 s for each `execute` request, 0.2 s between the messages of a streamed run. A
# run that ends within it is answered with one "finished" result holding all its output.
EXECUTE_FLUSH = 2.0
STREAM_FLUSH = 0.2
MAX_SECONDS = 2**31 - 1  # what the database's integer columns hold


def first_of(data, *keys, default=None):
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    return default


def body_of(request):
    if not isinstance(request.data, dict):
        raise RequestFailed("The request body must be a JSON object.")
    return request.data


def whole_number(value, field, minimum):
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum:
        raise RequestFailed(f"{field} must be a whole number of at least {minimum}.",
                            data={field: [f"must be a whole number of at least {minimum}"]})
    return number


def text(value, field):
    if value is not None and not isinstance(value, str):
        raise RequestFailed(f"{field} must be a string.", data={field: ["must be a string"]})
    return value


@extend_schema(exclude=True)
class CompatView(APIView):
    """Looks sessions up as the manager does: by name among the owner's sessions (live
    first, else the most recent finished one), or by id; the owner is the caller's
    keypair, or for admins `owner_access_key`."""

    def owner(self, request):
        key = first_of(request.query_params, "owner_access_key", "ownerAccessKey")
        return owner_keypair(request, key)

    def session(self, request, ref, *, touch=False):
        sessions = visible_sessions(request)
        session_id = as_uuid(ref)  # an id names any session the request sees
        found = sessions.filter(pk=session_id).first() if session_id else None
        if found is None:
            found = sessions.filter(keypair=self.owner(request)).find(ref)
        if found is None:
            raise RequestFailed(f"There is no session named {ref!r}.", 404,
                                problem="session-not-found")
        if touch:
            activity.touch(found.pk, request.user)
        return found


def project_for(domain_name, group_name):
    if not domain_name and not group_name:
        return default_project()
    domain = Domain.objects.filter(name=domain_name or "default", is_active=True).first()
    if domain is None:
        raise RequestFailed(f"There is no active domain {domain_name!r}.",
                            data={"domain": ["unknown domain"]})
    project = Project.objects.filter(domain=domain, name=group_name or "default",
                                     is_active=True).first()
    if project is None:
        raise RequestFailed(f"There is no active group {group_name!r} in domain "
                            f"{domain.name!r}.", data={"group": ["unknown group"]})
    return project


# What the SDK may send that this server does not do, and why (a 400 when set).
UNSUPPORTED_CREATE_FIELDS = {
    "config.preopen_ports": "kernels publish only their image's service ports, through the "
                            "web process's app proxy",
    "config.attach_network": "there are no user-made networks (backend.ai network): each "
                             "session's kernels get a network of their own",
    "callback_url": "this server calls no URL back; follow the session at /events/session",
}


def creation_fields(data, *, admin=False):
    """create_session's arguments from the SDK's create body; `admin`: the caller may
    name agents (config.agentList)."""
    config = first_of(data, "config", default={})
    if not isinstance(config, dict):
        raise RequestFailed("config must be an object.", data={"config": ["must be an object"]})
    given = {"config.preopen_ports": config.get("preopen_ports"),
             "config.attach_network": config.get("attach_network"),
             "callback_url": first_of(data, "callback_url", "callbackURL", "callbackUrl")}
    unsupported = [name for name, value in given.items() if value]
    if unsupported:
        raise RequestFailed(
            "Not supported by this server: " + "; ".join(
                f"{name} ({UNSUPPORTED_CREATE_FIELDS[name]})" for name in unsupported) + ".",
            data={name: ["not supported"] for name in unsupported})
    agent_list = first_of(config, "agentList", "agent_list")
    if agent_list and not admin:
        raise RequestFailed("Only administrators may place a session on named agents "
                            "(config.agentList).", 403)
    dependencies = first_of(data, "dependencies", default=[])
    if not isinstance(dependencies, list) or not all(isinstance(d, str) for d in dependencies):
        raise RequestFailed("dependencies must be a list of session ids or names.",
                            data={"dependencies": ["must be a list of strings"]})
    resources = first_of(config, "resources", default={}) or None
    fields = {
        "mounts": sdk_mounts(config.get("mounts"), config.get("mount_map")),
        "name": text(first_of(data, "name", "session_name", "clientSessionToken"), "name"),
        "image": text(first_of(data, "image", "lang"), "image"),
        "session_type": text(first_of(data, "type", "sessionType", default=SessionType.INTERACTIVE),
                             "type"),
        "resources": resources,
        "cluster_size": whole_number(first_of(data, "clusterSize", "cluster_size", default=1),
                                     "clusterSize", 1),
        "cluster_mode": text(first_of(data, "clusterMode", "cluster_mode",
                                      default="single-node"), "clusterMode"),
        "startup_command": text(first_of(data, "startupCommand", default=""),
                                "startupCommand"),
        "scaling_group": text(first_of(config, "scalingGroup", "scaling_group",
                                       default="default"), "config.scalingGroup"),
        "tag": text(first_of(data, "tag", default=""), "tag")[:64],
        "project": project_for(text(data.get("domain"), "domain"),
                               text(data.get("group"), "group")),
        "dependencies": dependencies,
        "priority": None if data.get("priority") is None else whole_number(
            data["priority"], "priority", 0),
        # The script's text, as the clients' --bootstrap-script FILE sends it.
        "bootstrap_script": text(data.get("bootstrap_script") or "", "bootstrap_script"),
        "environ": config.get("environ") or {},
        "batch_timeout": seconds_of(first_of(data, "batch_timeout", "batchTimeout"),
                                    "batch_timeout"),
        "not_before": starts_at_of(first_of(data, "starts_at", "startsAt")),
        "designated_agents": agent_list or (),
    }
    if fields["batch_timeout"] is not None and fields["session_type"] != SessionType.BATCH:
        raise RequestFailed("batch_timeout is only for batch sessions.",
                            data={"batch_timeout": ["only for batch sessions"]})
    return fields


def seconds_of(value, field):
    """A whole number of seconds, at least 1, from a number or a duration ("30m", "1h");
    None for None (API v8: the CLI sends --batch-timeout as it was typed)."""
    if value is None:
        return None
    try:
        seconds = clock.duration_seconds(value)
    except ValueError:
        seconds = None
    if seconds is None or seconds < 1 or seconds > MAX_SECONDS or seconds != int(seconds):
        raise RequestFailed(f"{field} must be a whole number of at least 1 (seconds), or a "
                            "duration such as 30m or 2h.",
                            data={field: ["seconds, at least 1, or a duration"]})
    return int(seconds)


def starts_at_of(value):
    """Backend.AI's starts_at: an ISO 8601 time (UTC when it names no zone), or a delay
    from now such as "1m", "30s" or "300"; None for none."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            delay = clock.duration_seconds(value)
        except ValueError:
            delay = None
        if delay is not None and delay <= MAX_SECONDS:
            return clock.now() + timedelta(seconds=delay)
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            moment = None
        if moment is not None:
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    raise RequestFailed("starts_at must be a time (ISO 8601) or a delay such as 10m.",
                        data={"starts_at": ["a time or a delay"]})


def sdk_mounts(names, mount_map):
    """The SDK's config.mounts (folder names) and config.mount_map ({name: path}; a
    relative path is under /home/work) as create_session's mounts."""
    names = names or []
    mount_map = mount_map or {}
    if not isinstance(names, list) or not isinstance(mount_map, dict) or \
            not all(isinstance(name, str) for name in names):
        raise RequestFailed("config.mounts is a list of folder names and config.mount_map "
                            "an object of folder name to path.",
                            data={"config.mounts": ["must be a list"]})
    mounts = []
    for name in names:
        path = mount_map.get(name)
        if isinstance(path, str) and path and not path.startswith("/"):
            path = f"/home/work/{path}"
        mounts.append({"name": name} if path is None else {"name": name, "path": path})
    extra = set(mount_map) - set(names)
    if extra:
        raise RequestFailed(f"config.mount_map names folders not in config.mounts: "
                            f"{', '.join(sorted(map(str, extra)))}.",
                            data={"config.mount_map": ["unknown folders"]})
    return mounts


def creation_answer(session, created, status_text=None):
    return {"sessionId": str(session.pk), "sessionName": session.name,
            "status": status_text or session.status, "servicePorts": service_ports_of(session),
            "created": created}


def service_ports_of(session):
    """The services its image declares (ai.backend.service-ports), in the SDK's shape;
    each is opened through /sessions/<id>/apps/<name>/."""
    return [s.as_backendai() for s in service_ports.of_image(session.image)]


class CreateSession(CompatView):
    """POST /session: get-or-create; unless `enqueueOnly`, answers once the session is
    RUNNING (a batch session: once it has finished), can no longer start, or
    `maxWaitSeconds` (0: no limit) have passed (status "TIMEOUT")."""

    def post(self, request):
        return self.answer(request, body_of(request))

    def answer(self, request, data):
        owner = owner_keypair(request, data.get("owner_access_key"), creating=True)
        fields = creation_fields(data, admin=request_is_admin(request))
        enqueue_only = is_true(data.get("enqueueOnly", False))
        max_wait = whole_number(data.get("maxWaitSeconds", 0), "maxWaitSeconds", 0)
        existing = Session.objects.filter(keypair=owner, name=fields["name"]).live().first()
        if existing is not None:
            if not is_true(data.get("reuseIfExists", True)):
                raise RequestFailed(f"The session {existing.name!r} already exists.", 409,
                                    problem="session-already-exists",
                                    data={"existingSessionId": str(existing.pk)})
            if existing.image != (fields["image"] or "").strip():
                raise RequestFailed(f"The session {existing.name!r} already exists with "
                                    f"another image, {existing.image}.", 400)
            return Response(creation_answer(existing, created=False))
        fields["dependencies"] = resolve_dependencies(request, owner, fields["dependencies"])
        session = create_for(request, owner, **fields)
        response = Response(creation_answer(session, created=True),
                            status=status.HTTP_201_CREATED)
        if not enqueue_only:
            # A batch session is answered once its command has ended, with its final
            # status; an interactive one once it runs. The wait is the event loop's, not a
            # thread's (with_follow_up).
            wait = wait_until_finished if session.session_type == SessionType.BATCH \
                else wait_until_started

            async def follow_up():
                response.data["status"] = await wait(session.pk, max_wait)
                return response
            response.follow_up = follow_up
        return response


def session_info(session):
    main = session.main_kernel
    return {
        "sessionId": str(session.pk), "sessionName": session.name,
        "domainName": session.domain.name, "groupName": session.project.name,
        "groupId": str(session.project_id), "userId": str(session.user_id),
        "ownerAccessKey": session.keypair_id, "type": session.session_type,
        "lang": session.image, "image": session.image, "architecture": "x86_64",
        "registry": "", "tag": session.tag, "clusterMode": session.cluster_mode,
        "clusterSize": session.cluster_size, "containerId": main.container_id,
        "agentId": main.agent_id, "requestedSlots": session.requested_slots,
        "occupyingSlots": session.occupying_slots, "occupiedSlots": main.occupied_slots,
        "environ": session.environ or {}, "resourceOpts": {}, "status": session.status,
        "statusInfo": session.status_info, "statusData": session.status_data,
        "result": session.result.upper(), "creationTime": session.created_at.isoformat(),
        "terminationTime": session.terminated_at.isoformat() if session.terminated_at
        else None, "numQueriesExecuted": 0, "lastStat": main.last_stat,
        "idleChecks": idle_checks_of(session, clock.now()),
        "priority": session.priority, "preemptible": session.preemptible,
        "queue": session.queue, "servicePorts": service_ports_of(session),
    }


def destroy_stats(result):
    """The manager's answer to a destroy: its main kernel's last statistics with
    `status` "cancelled" (it never started) or "terminated" (it did, or is stopping), as
    the clients' `--stats` reads them (version 2: a unit hint for each measure)."""
    stat = result.last_stat or {}
    stats = {"status": "cancelled" if result.status == Status.CANCELLED.lower()
             else "terminated", "version": 2}
    if stat.get("mem_bytes") is not None:
        stats["mem"] = {"current": str(stat["mem_bytes"]), "unit_hint": "bytes"}
    if stat.get("cpu_percent") is not None:
        pct = f"{float(stat['cpu_percent']):.2f}"
        stats["cpu_util"] = {"current": pct, "pct": pct, "unit_hint": "percent"}
    return stats


def destroy_as_manager(request, session, forced):
    """destroy_for, refused as the Backend.AI manager refuses: a status that does not allow
    the destroy is its GenericForbidden (403), with the same message (what refuses it and
    when the status ends by itself). The REST API keeps 409 (api/views.py)."""
    try:
        return destroy_for(request, session, forced)
    except DestroyRefused as refusal:
        if refusal.status_code != 409:
            raise
        raise RequestFailed(refusal.message, 403, problem="generic-forbidden") from None


def dependents_of(session):
    """Live sessions that depend on `session`, directly or not, the farthest first."""
    found, frontier = [], [session]
    while frontier:
        nxt = list(Session.objects.filter(dependencies__in=frontier).live()
                   .exclude(pk__in=[s.pk for s in found] + [session.pk]).distinct())
        found += nxt
        frontier = nxt
    return found[::-1]


@functools.cache
def python_query_source():
    return Path(python_query.__file__).read_text()


def is_python(labels):
    runtime = labels.get(RUNTIME_PATH_LABEL) or ""
    return labels.get(RUNTIME_TYPE_LABEL) == "python" or \
        runtime.rpartition("/")[2].startswith("python")


def query_command(labels, code):
    """The shell command of query-mode `code` on an image with these labels, and whether
    it marks its code's start: on a Python image, a run in the kernel's one interpreter
    (agents_app/runtime/python_query.py, marked); on another image naming its interpreter
    (`ai.backend.runtime-path`), `PATH -c CODE`; else the code itself, for the shell."""
    runtime = labels.get(RUNTIME_PATH_LABEL)
    if is_python(labels):
        return (f"exec {shlex.quote(runtime or 'python3')} "
                f"-c {shlex.quote(python_query_source())} run {shlex.quote(code)}"), True
    if runtime:
        return f"exec {shlex.quote(runtime)} -c {shlex.quote(code)}", False
    return code, False


def run_command(session, data):
    """What an execute request runs: (the shell command, or None for the next part of a
    run going on; its run id; whether the command marks its code's start)."""
    mode = data.get("mode")
    run_id = text(data.get("runId"), "runId") or uuid.uuid4().hex
    if not stream_tokens.TERMINAL_ID.match(run_id):
        raise RequestFailed("runId is 1 to 64 letters, digits, '_' or '-'.",
                            data={"runId": ["1 to 64 letters, digits, '_' or '-'"]})
    if mode == "query":
        code = text(data.get("code"), "code")
        if code is None:
            raise RequestFailed("query mode needs code.", data={"code": ["required"]})
        image = Image.objects.filter(name=session.image).first()
        command, marked = query_command((image.labels or {}) if image else {}, code)
        return command, run_id, marked
    if mode == "batch":
        options = data.get("options") or {}
        if not isinstance(options, dict):
            raise RequestFailed("options must be an object.")
        steps = [text(options.get(step), f"options.{step}") for step in ("build", "exec")]
        steps = [f"( {step} )" for step in steps if step and step != "*"]
        if not text(options.get("exec"), "options.exec"):
            raise RequestFailed("batch mode needs options.exec.",
                                data={"options.exec": ["required"]})
        return " && ".join(steps), run_id, False
    if mode == "continue":
        if data.get("runId") is None:
            raise RequestFailed("continue needs the runId of the run.",
                                data={"runId": ["required"]})
        return None, run_id, False
    raise RequestFailed(f"Unsupported execution mode {mode!r}; this server runs query, "
                        "batch and continue (a run has no stdin, so never waits for input).",
                        data={"mode": ["query, batch or continue"]})


def execution_result(run_id, result):
    """The manager's answer to `execute`: the agent's result of the run's next part."""
    return {"result": {"runId": run_id, "status": result.get("status"),
                       "exitCode": result.get("exitCode"), "console": result.get("console", []),
                       "options": None, "files": []}}


async def execute_step(grant, body):
    """The next result of a run, from the kernel's agent (agents_app/runtime/
    session_streams.py, POST /v1/exec/step)."""
    try:
        async with client().post(grant.url("/v1/exec/step"), json=body,
                                 headers={stream_tokens.TOKEN_HEADER: grant.token}) as upstream:
            answer = await upstream.json(content_type=None)
            status_code = upstream.status
    except (TimeoutError, ClientError, ValueError) as exc:
        raise RequestFailed(f"The session's agent does not answer ({type(exc).__name__}).",
                            502) from None
    if status_code != 200:
        message = answer.get("error") if isinstance(answer, dict) else None
        if status_code in (400, 404, 409) and message:
            raise RequestFailed(message, status_code)
        raise RequestFailed(f"The session's agent failed ({status_code}): "
                            f"{message or 'no reason given'}", 502)
    return answer


class SessionResource(CompatView):
    """GET: information; DELETE: destroy (`forced`, `recursive`); PATCH: restart; POST:
    execute code (`query`) or `options.build` then `options.exec` (`batch`)."""

    def get(self, request, ref):
        return Response(session_info(self.session(request, ref)))

    def delete(self, request, ref):
        session = self.session(request, ref, touch=False)
        forced = is_true(request.query_params.get("forced", ""))
        if is_true(request.query_params.get("recursive", "")):
            for dependent in dependents_of(session):
                destroy_as_manager(request, dependent, forced)
        result = destroy_as_manager(request, session, forced)
        return Response({"stats": destroy_stats(result), "status": result.status})

    def patch(self, request, ref):
        restart_session(self.session(request, ref, touch=True),
                        actor=request.user.get_username())
        return Response(status=status.HTTP_204_NO_CONTENT)

    def post(self, request, ref):
        data = body_of(request)
        session = self.session(request, ref, touch=True)  # a command is activity
        command, run_id, marked = run_command(session, data)
        running_main_kernel(session)  # else 409, saying so
        try:
            grant = access.grant(request.user, session.pk, f"exec:{run_id}",
                                 acting_keypair(request))
        except access.Refusal as refusal:
            raise RequestFailed(refusal.message, refusal.status) from None
        body = {"flush": EXECUTE_FLUSH}
        if command is not None:
            body.update(command=command, timeout=EXECUTE_TIMEOUT, marked=marked)
        response = Response()

        async def follow_up():
            # The wait (up to EXECUTE_FLUSH) is the event loop's, not a thread's.
            response.data = execution_result(run_id, await execute_step(grant, body))
            return response
        response.follow_up = follow_up
        return response


class CommitSession(CompatView):
    """POST /session/NAME/commit (ComputeSession.commit, `backend.ai session commit`): the
    main kernel saved as an image (sessions_app/commits.py), answered at once (201) with
    the background task that follows it: `{"bgtask_id", "kernel", "path": null, "image"}`
    (Backend.AI's agent writes a tar file at `path`; here the image is registered)."""

    def post(self, request, ref):
        session = self.session(request, ref, touch=True)
        task = commits.start_commit(session, user=request.user)
        return Response({"bgtask_id": str(task.pk), "kernel": task.result["kernel"],
                         "path": None, "image": task.result["image"]},
                        status=status.HTTP_201_CREATED)


class ConvertToImage(CompatView):
    """POST /session/NAME/imagify?image_name=NAME (ComputeSession.export_to_image, `backend.ai
    session convert-to-image`): the same, as the image <owner's prefix>/NAME; `{"task_id"}`.
    Nothing is pushed to a registry: the image stays on the kernel's agent host."""

    def post(self, request, ref):
        data = request.data if isinstance(request.data, dict) else {}
        name = first_of(request.query_params, "image_name") or data.get("image_name")
        if not name:
            raise RequestFailed("image_name is required: the name of the new image.",
                                data={"image_name": ["required"]})
        session = self.session(request, ref, touch=True)
        return Response({"task_id": str(commits.start_commit(
            session, user=request.user, name=name).pk)})


class BackgroundTaskEvents(CompatView):
    """GET /events/background-task?task_id=ID: Server-Sent Events of a background task of
    the caller's (admins: anyone's), as the SDK's BackgroundTask.listen_events reads them:
    `bgtask_updated` {"task_id", "message", "current_progress", "total_progress"} as it
    goes (its last state first), then one of `bgtask_done` / `bgtask_failed` /
    `bgtask_cancelled` {"task_id", "message"}, then `server_close`."""

    def get(self, request):
        task_id = as_uuid(first_of(request.query_params, "task_id", "taskId"))
        if task_id is None:
            raise RequestFailed("task_id must be the id of a background task.",
                                data={"task_id": ["not a UUID"]})
        tasks = BackgroundTask.objects.filter(pk=task_id)
        if not request_is_admin(request):
            tasks = tasks.filter(user=request.user)
        if not tasks.exists():
            raise RequestFailed(f"There is no background task {task_id}.", 404)

        async def follow_up():
            response = StreamingHttpResponse(bgtask_stream(task_id),
                                             content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"
            return response
        response = Response()
        response.follow_up = follow_up
        return response


def bgtask_state(task_id):
    task = BackgroundTask.objects.get(pk=task_id)
    commits.expire_if_stale(task)  # its agent is gone: say so rather than wait for ever
    return commits.event_of(task)


async def bgtask_stream(task_id):
    async with subscription([commits.bgtask_group(task_id)]) as queue:
        yield ": connected\n\n"
        last, waited = None, 0.0
        while True:
            name, data = await sync_to_async(bgtask_state)(task_id)
            if (name, data) != last:
                yield sse(name, data)
                last, waited = (name, data), 0.0
            if name != "bgtask_updated":
                yield sse("server_close", {})
                return
            if await next_message(queue, RECHECK_SECONDS) is None:
                waited += RECHECK_SECONDS
                if waited >= KEEPALIVE_SECONDS:
                    yield ": keep-alive\n\n"
                    waited = 0.0


def graph_time(moment):
    """`str(datetime)` with microseconds always there: the clients cut at the dot."""
    if moment is None:
        return "None"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + "+00:00"


def dependency_node(session, seen):
    """The manager's dependency-graph node of `session`: the sessions it depends on, each
    with its own; a session met twice on one path (a cycle) is not followed again."""
    node = {"session_id": str(session.pk), "session_name": session.name,
            "status": f"KernelStatus.{session.status}",
            "status_changed": graph_time(session.status_changed or session.created_at),
            "depends_on": []}
    if session.pk in seen:
        return node
    for dependency in session.dependencies.order_by("created_at"):
        node["depends_on"].append(dependency_node(dependency, seen | {session.pk}))
    return node


class DependencyGraph(CompatView):
    """GET /session/{ref}/dependency-graph: the root node, as `session show-graph` reads it."""

    def get(self, request, ref):
        return Response(dependency_node(self.session(request, ref), frozenset()))


class RenameSession(CompatView):
    def post(self, request, ref):
        data = request.data if isinstance(request.data, dict) else {}
        new_name = first_of(request.query_params, "name", "session_name") or \
            first_of(data, "name", "session_name")
        if not isinstance(new_name, str) or not new_name:
            raise RequestFailed("The new name is required (name).", data={"name": ["required"]})
        rename_for(request, self.session(request, ref), new_name)
        return Response(status=status.HTTP_204_NO_CONTENT)


class StopSession(CompatView):
    """POST /session/NAME/stop: this project's stop (Backend.AI has none): the compute
    freed, the files kept; resumed with POST /session/NAME/resume."""

    def post(self, request, ref):
        session = stop_session(self.session(request, ref), actor=request.user,
                               keypair=acting_keypair(request))
        return Response({"status": session.status}, status=status.HTTP_202_ACCEPTED)


class ResumeSession(CompatView):
    def post(self, request, ref):
        session = resume_session(self.session(request, ref), actor=request.user,
                                 keypair=acting_keypair(request))
        return Response({"status": session.status}, status=status.HTTP_202_ACCEPTED)


class SessionLogs(CompatView):
    def get(self, request, ref):
        return Response({"result": {"logs": session_logs(self.session(request, ref))["logs"]}})


class StatusHistory(CompatView):
    def get(self, request, ref):
        history = self.session(request, ref).status_history
        # In time order: PostgreSQL's jsonb keeps no key order.
        return Response({"result": dict(sorted(history.items(), key=lambda item: item[1]))})


class SessionEvents(CompatView):
    """GET /events/session: Server-Sent Events of sessions' lifecycles.

    For one session (`sessionId`, or `name` with `ownerAccessKey`): its stored history
    first, then live events, and `server_close` once it has finished. A name that matches
    no session yet follows the first session of that name to appear. `name=*` (the
    default) follows all of the owner's sessions (admins without an owner: everyone's)
    and never closes. `scope` is `*`, `session` or `kernel`; `group` a project name.
    Comment lines keep the connection alive.
    """

    def get(self, request):
        params = request.query_params
        scope = params.get("scope", "*")
        if scope not in ("*", "session", "kernel"):
            raise RequestFailed("scope must be *, session or kernel.",
                                data={"scope": ["*, session or kernel"]})
        name = first_of(params, "name", "sessionName", default="*")
        group = first_of(params, "group", "groupName", default="*")
        project_id = None
        if group != "*":
            project = Project.objects.filter(name=group).first()
            if project is None:
                raise RequestFailed(f"There is no group {group!r}.", 404)
            project_id = project.pk
        owner_key = first_of(params, "ownerAccessKey", "owner_access_key")
        owner = owner_keypair(request, owner_key)
        spec = {"scope": scope, "project_id": project_id, "session_id": None, "name": None}
        if params.get("sessionId"):
            try:
                session_id = uuid.UUID(params["sessionId"])
            except ValueError:
                raise RequestFailed("sessionId must be a session id.",
                                    data={"sessionId": ["not a UUID"]}) from None
            session = visible_sessions(request).filter(pk=session_id).first()
            if session is None:
                raise RequestFailed("There is no such session.", 404,
                                    problem="session-not-found")
            spec["session_id"] = session.pk
        elif name != "*":
            session = visible_sessions(request).filter(keypair=owner).find(name)
            if session is not None:
                spec["session_id"] = session.pk
            else:
                spec["name"] = name
        if spec["session_id"]:
            groups = [session_group(spec["session_id"])]
        elif request_is_admin(request) and not owner_key:
            groups = [ADMINS_GROUP]
        else:
            groups = [user_group(owner.user_id)]
        # One session was already checked; a user's group carries only that user's.
        spec["owner_id"] = owner.user_id if groups == [user_group(owner.user_id)] else None

        async def follow_up():
            response = StreamingHttpResponse(event_stream(groups, spec),
                                             content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"
            return response
        response = Response()
        response.follow_up = follow_up
        return response


def session_facts(session_id):
    return Session.objects.filter(pk=session_id).values(
        "keypair_id", "project_id", "user_id", "domain__name", "project__name",
        "user__username").first()


async def event_stream(groups, spec):
    """SSE lines for the stream `spec` describes (see SessionEvents)."""
    facts = {}  # session id → owner and project, read once per session
    target = spec["session_id"] and str(spec["session_id"])

    async def wanted(msg):
        nonlocal target
        event = msg.get("event", "")
        if spec["scope"] != "*" and not event.startswith(spec["scope"] + "_"):
            return None
        session_id = msg.get("session_id")
        if target is None and spec["name"] and msg.get("session_name") == spec["name"]:
            target = session_id  # the first session of that name to appear
        if target is not None and session_id != target:
            return None
        if session_id not in facts:
            facts[session_id] = await sync_to_async(session_facts)(session_id) or {}
        fact = facts[session_id]
        if spec["owner_id"] is not None and fact.get("user_id") != spec["owner_id"]:
            return None
        if spec["project_id"] is not None and fact.get("project_id") != spec["project_id"]:
            return None
        return sse(event, sse_data(msg, fact))

    async with subscription(groups) as queue:
        yield ": connected\n\n"
        seen = set()
        if target:
            history, finished = await sync_to_async(history_messages)(target)
            for msg in history:
                seen.add(message_key(msg))
                line = await wanted(msg)
                if line:
                    yield line
            if finished:
                yield sse("server_close", {})
                return
        while True:
            msg = await next_message(queue, KEEPALIVE_SECONDS)
            if msg is None:
                yield ": keep-alive\n\n"
                continue
            if message_key(msg) in seen:
                continue
            line = await wanted(msg)
            if line:
                yield line
            if target and msg.get("session_id") == target and \
                    msg.get("event", "").startswith("session_") and \
                    msg.get("status") in StatusGroup.FINISHED:
                yield sse("server_close", {})
                return


def sse_data(msg, fact):
    """An event as Backend.AI's manager streams it (its field names: `kernelId`,
    `clusterRole` and `clusterIdx` for a kernel's events), with the session's domain,
    project (Backend.AI's group) and owner by name, the status and the time."""
    data = {"reason": msg.get("reason", ""), "sessionName": msg.get("session_name"),
            "ownerAccessKey": fact.get("keypair_id"), "sessionId": msg.get("session_id"),
            "exitCode": (msg.get("data") or {}).get("exit_code"),
            "domainName": fact.get("domain__name"), "groupName": fact.get("project__name"),
            "userName": fact.get("user__username"),
            "status": msg.get("status"), "at": msg.get("at")}
    if msg.get("kernel_id"):
        data["kernelId"] = msg["kernel_id"]
        data["clusterRole"] = msg.get("cluster_role")
        data["clusterIdx"] = msg.get("cluster_idx")
    return data


@extend_schema(exclude=True)
class NotSupported(CompatView):
    """A route of the Backend.AI manager this server does not serve: 501, saying why
    (`reason`), after the same authentication as every route."""

    reason = ""

    def refuse(self, request, *args, **kwargs):
        raise RequestFailed(f"Not supported by this server: {self.reason}.", 501,
                            problem="not-implemented")

    get = post = put = patch = delete = refuse


MAX_MATCHES = 10


@extend_schema(exclude=True)
class MatchSessions(CompatView):
    """GET /session/_/match?id=PREFIX: the owner's sessions whose id or name starts with
    PREFIX (at most 10, live ones first), as `{"matches": [{"id", "name", "status"}]}`."""

    def get(self, request):
        prefix = first_of(request.query_params, "id", "prefix") or ""
        if not prefix.strip():
            raise RequestFailed("id (a prefix of a session's id or name) is required.",
                                data={"id": ["required"]})
        sessions = visible_sessions(request).filter(keypair=self.owner(request))
        # Django compares a UUID's text without its hyphens, whichever way it is written.
        matches = sessions.filter(Q(name__startswith=prefix) | Q(pk__startswith=prefix))
        found = sorted(matches[:100], key=lambda s: (s.is_finished, -s.created_at.timestamp()))
        return Response({"matches": [{"id": str(s.pk), "name": s.name, "status": s.status}
                                     for s in found[:MAX_MATCHES]]})


@extend_schema(exclude=True)
class TaskLogs(CompatView):
    """GET /session/_/logs?taskId=ID (`backend.ai task-logs`): the log of the session (or
    the kernel) with that id, as text."""

    def get(self, request):
        task_id = as_uuid(first_of(request.query_params, "taskId", "task_id", "kernel_id"))
        if task_id is None:
            raise RequestFailed("taskId (a session's or kernel's id) is required.",
                                data={"taskId": ["a session or kernel id"]})
        session = visible_sessions(request).filter(Q(pk=task_id) | Q(kernels__pk=task_id)) \
            .distinct().first()
        if session is None:
            raise RequestFailed("There is no such task.", 404, problem="session-not-found")
        return HttpResponse(session_logs(session)["logs"], content_type="text/plain")

    head = get


@extend_schema(exclude=True)
class SessionApps(CompatView):
    """GET /stream/session/NAME/apps: the services its image declares, as `backend.ai
    apps` lists them (each is opened at /sessions/ID/apps/NAME/ in a browser)."""

    def get(self, request, ref):
        return Response(service_ports_of(self.session(request, ref)))


@extend_schema(exclude=True)
class AbusingReport(CompatView):
    """GET /session/NAME/abusing-report: nothing is watched for abuse here: none."""

    def get(self, request, ref):
        self.session(request, ref)
        return Response({})
