"""Run by the 26.9.6 client's own Python (tests/live/test_sdk_functions.py), with BACKEND_*
in the environment: the functions of one SDK class, called as a script calls them
(ai.backend.client.session.Session, synchronous). Prints one JSON line per call:
{"call": LABEL, "result": …}, or {"call": LABEL, "status": HTTP status, "error": the
server's JSON error}, or {"call": LABEL, "exception": text} for anything else.

    python sdk_functions.py CLASS [ARGUMENTS…]

CLASS is compute-session, session-template, resource, image, agent, keypair,
keypair-resource-policy, manager or admin (see each function for its arguments).
"""

import asyncio
import json
import sys
import tempfile
import uuid
from pathlib import Path

from ai.backend.client.exceptions import BackendAPIError
from ai.backend.client.session import AsyncSession, Session

IMAGE = "bai-local/busybox:latest"
SMALL = {"cpu": "0.5", "mem": "128m"}


def say(**fields):
    print(json.dumps(fields, default=str), flush=True)


def call(label, function, *args, **kwargs):
    try:
        result = function(*args, **kwargs)
    except BackendAPIError as exc:
        say(call=label, status=exc.status, error=exc.data)
        return None
    except Exception as exc:  # the script goes on: each call is judged by the test
        say(call=label, exception=f"{type(exc).__name__}: {exc}")
        return None
    if hasattr(result, "items") and hasattr(result, "total_count"):  # PaginatedResult
        result = {"total_count": result.total_count, "items": list(result.items)}
    say(call=label, result=result)
    return result


def compute_session(api, name):
    """Every ComputeSession function of this part, on an interactive session `name`."""
    cs = api.ComputeSession
    call("hello", cs.hello)
    session = call("get_or_create", cs.get_or_create, IMAGE, name=name, resources=SMALL,
                   tag="sdk")
    if session is None:
        return
    say(call="created", result={"id": str(session.id), "status": session.status})
    by_id = cs.from_session_id(session.id)
    call("get_info", session.get_info)
    call("detail", by_id.detail)
    call("paginated_list", cs.paginated_list, status="RUNNING")
    call("get_logs", session.get_logs)
    call("get_status_history", session.get_status_history)
    call("get_dependency_graph", session.get_dependency_graph)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "sub").mkdir()
        (Path(folder) / "sub" / "hello.txt").write_text("hello, files")
        call("upload", lambda: session.upload([Path(folder) / "sub" / "hello.txt"],
                                              basedir=folder).status)
    call("list_files", session.list_files, "sub")
    call("list_files_home", session.list_files, "/home/work")
    call("list_files_outside", session.list_files, "/etc")
    call("stream_app_info", session.stream_app_info)
    call("get_abusing_report", session.get_abusing_report)
    call("update", by_id.update, priority=3)
    call("rename", session.rename, name + "-r")
    renamed = cs(name + "-r")
    call("get_task_logs", lambda: b"".join(cs.get_task_logs(str(session.id))).decode())
    call("interrupt", renamed.interrupt)
    call("complete", renamed.complete, "pri")
    call("start_service", renamed.start_service, "jupyter")
    call("restart", renamed.restart)
    call("destroy", renamed.destroy)


def compute_session_batch(api, name, starts_at=""):
    """A batch session with a batch timeout (API v8 sends it), and one that starts later."""
    cs = api.ComputeSession
    call("batch", lambda: cs.get_or_create(
        IMAGE, name=name, type_="batch", startup_command="sleep 60", batch_timeout="3s",
        resources=SMALL, enqueue_only=True).status)
    if starts_at:
        later = call("starts_at", lambda: str(cs.get_or_create(
            IMAGE, name=name + "-later", type_="batch", startup_command="echo started",
            starts_at=starts_at, resources=SMALL, enqueue_only=True).id))
        if later:
            call("later_info", lambda: cs.from_session_id(uuid.UUID(later)).get_info())


def compute_session_agents(api, name, agent_id):
    """A session placed on a named agent (admins only)."""
    call("assign_agent", lambda: api.ComputeSession.get_or_create(
        IMAGE, name=name, resources=SMALL, assign_agent=[agent_id]).status)


def session_template(api, name):
    """A template in the SDK's documented list form, then every SessionTemplate function
    and a session from it."""
    template = {"api_version": "v1", "kind": "taskTemplate",
                "metadata": {"name": name, "tag": "tpl"},
                "spec": {"session_type": "interactive",
                         "kernel": {"image": IMAGE, "environ": {"FROM": "template"}},
                         "resources": SMALL}}
    body = json.dumps([{"is_active": True, "type": "task", "name": name,
                        "template": template}])
    created = call("create", lambda: api.SessionTemplate.create(body).template_id)
    if created is None:
        return
    stored = api.SessionTemplate(created)
    call("list_templates", api.SessionTemplate.list_templates)
    call("get", stored.get, "json")
    template["metadata"]["tag"] = "changed"
    call("put", stored.put, json.dumps(template))
    call("create_from_template", lambda: api.ComputeSession.create_from_template(
        created, name=name + "-s", enqueue_only=True).status)
    call("delete", stored.delete)


def resource(api, scaling_group):
    r = api.Resource
    call("list", r.list)
    call("check_presets", r.check_presets, scaling_group=scaling_group)
    call("get_container_registries", r.get_container_registries)
    # Its synchronous form calls get_container_registries from inside the SDK's worker
    # thread and never returns, whatever the server: as scripts use it, asynchronously.
    call("get_docker_registries", asyncio.run, docker_registries())
    call("get_resource_slots", r.get_resource_slots)
    call("get_vfolder_types", r.get_vfolder_types)
    call("recalculate_usage", r.recalculate_usage)
    call("usage_per_month", r.usage_per_month, "202601", ["default"])
    call("usage_per_period", r.usage_per_period, None, "20260101", "20260131")
    call("user_monthly_stats", r.user_monthly_stats)
    call("admin_monthly_stats", r.admin_monthly_stats)


async def docker_registries():
    async with AsyncSession() as api:
        return await api.Resource.get_docker_registries()


def image(api, image_id):
    i = api.Image
    call("list", i.list)
    call("get", i.get, IMAGE, "x86_64")
    call("get_by_id", i.get_by_id, image_id)
    call("list_customized", i.list_customized)
    call("rescan_images", i.rescan_images, "local")
    call("forget_image", i.forget_image, IMAGE, "x86_64")
    call("forget_image_by_id", i.forget_image_by_id, image_id)
    call("purge_image_by_id", i.purge_image_by_id, image_id)
    call("untag_image_from_registry", i.untag_image_from_registry, image_id)
    call("alias_image", i.alias_image, "bb", IMAGE)
    call("dealias_image", i.dealias_image, "bb")


def agent(api, agent_id):
    call("paginated_list", api.Agent.paginated_list)
    call("detail", api.Agent.detail, agent_id)


def keypair(api, email):
    k = api.KeyPair
    made = call("create", k.create, email, resource_policy="default", rate_limit=1000)
    access_key = (made or {}).get("keypair", {}).get("access_key")
    call("update", k.update, access_key, rate_limit=2000)
    call("deactivate", k.deactivate, access_key)
    call("activate", k.activate, access_key)
    call("list", k.list, email)
    call("paginated_list", k.paginated_list)
    call("info", k(access_key).info)
    call("delete", k.delete, access_key)


def keypair_resource_policy(api, name):
    p = api.KeypairResourcePolicy
    call("create", p.create, name, default_for_unspecified="UNLIMITED",
         total_resource_slots='{"cpu": "4", "mem": "4g"}', max_session_lifetime=0,
         max_concurrent_sessions=5, max_concurrent_sftp_sessions=1,
         max_containers_per_session=1, idle_timeout=600,
         vfolder_host_perms='{"local": []}', max_pending_session_count=3,
         max_pending_session_resource_slots=None)
    call("update", p.update, name, idle_timeout=1200)
    call("list", p.list)
    call("info", p(None).info, name)
    call("delete", p.delete, name)


def manager(api, action):
    m = api.Manager
    if action == "freeze":
        call("freeze", m.freeze)
    elif action == "unfreeze":
        call("unfreeze", m.unfreeze)
    elif action == "create":
        call("create", lambda: api.ComputeSession.get_or_create(
            IMAGE, name=f"sdk-{uuid.uuid4().hex[:8]}", resources=SMALL, enqueue_only=True))
    else:
        call("status", m.status)
        call("update_announcement", m.update_announcement, True, "Maintenance at 18:00")
        call("get_announcement", m.get_announcement)
        call("scheduler_op", m.scheduler_op, "exclude-agents", [action])
        call("scheduler_op_back", m.scheduler_op, "include-agents", [action])


def admin(api, query):
    call("query", api.Admin.query, query)


CLASSES = {"compute-session": compute_session, "compute-session-batch": compute_session_batch,
           "compute-session-agents": compute_session_agents,
           "session-template": session_template, "resource": resource, "image": image,
           "agent": agent, "keypair": keypair, "keypair-resource-policy": keypair_resource_policy,
           "manager": manager, "admin": admin}


if __name__ == "__main__":
    with Session() as api:
        CLASSES[sys.argv[1]](api, *sys.argv[2:])
