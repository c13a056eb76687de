"""Issue 21's REST shapes without Docker: session templates (`/template/session`,
create-from-template, the dashboard's create form), destroy's `stats`, the dependency graph,
`bootstrap_script` and `config.environ` on their way to the agent, the batch-timeout failure,
and JSON errors on every path a client may call. The real CLIs run the same in
tests/live/test_compat_cli.py."""

import json

import pytest
import yaml
from django.http import HttpResponse, HttpResponseServerError
from django.test import RequestFactory

from agents_app import rpc
from agents_app.runtime.docker_backend import BOOTSTRAP_MARK, kernel_command, kernel_environment
from identity_app.keypairs import main_keypair
from identity_app.models import default_project
from sessions_app.api.handlers import as_json_error
from sessions_app.enums import SessionResult, SessionType, Status
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.models import Kernel, Session, SessionEvent, SessionTemplate
from sessions_app.realtime.streams import ENDED, STARTED_OR_ENDED
from sessions_app.session_templates import check_template, parse_payload
from sessions_app.spec import DomainError
from tests.factories import make_session
from tests.signing import signed_call

IMAGE = "bai-local/busybox:latest"
TEMPLATE_YAML = f"""
api_version: v1
kind: taskTemplate
metadata:
  name: py-job
  tag: nightly
spec:
  session_type: batch
  kernel:
    image: {IMAGE}
    environ:
      GREETING: hello
    run:
      bootstrap: echo boot
      startup_command: echo $GREETING
  resources:
    cpu: "1"
    mem: 128m
"""


@pytest.fixture
def kp(alice_keypair):
    return alice_keypair


@pytest.fixture
def others(bob, carol):
    """(bob's keypair, carol's: the admin's)."""
    return main_keypair(bob), main_keypair(carol)


def store(client, keypair, payload=TEMPLATE_YAML, **body):
    response = signed_call(client, keypair, "POST", "/template/session",
                           {"payload": payload, "group_name": None, "domain_name": None,
                            "owner_access_key": None, **body})
    assert response.status_code == 201, response.content
    return response.json()


# Templates: the documents.

def test_a_template_document_is_checked_and_normalized():
    template = check_template(yaml.safe_load(TEMPLATE_YAML))
    assert template == {
        "metadata": {"name": "py-job", "tag": "nightly"}, "session_type": "batch",
        "image": IMAGE, "environ": {"GREETING": "hello"}, "bootstrap": "echo boot",
        "startup_command": "echo $GREETING", "resources": {"cpu": "1", "mem": "128m"},
        "scaling_group": None, "mounts": {}, "cluster_size": None, "cluster_mode": None}


@pytest.mark.parametrize("payload, message", [
    ("{not: [valid", "Malformed payload"),
    ("kind: taskTemplate\nspec: {kernel: {image: x}}", "metadata.name is required"),
    ("metadata: {name: a}\nspec: {kernel: {}}", "spec.kernel.image is required"),
    ("metadata: {name: a}\nkind: other\nspec: {kernel: {image: x}}", "kind must be"),
    ("metadata: {name: a}\nspec: {session_type: cron, kernel: {image: x}}",
     "spec.session_type must be one of"),
    ("metadata: {name: a}\nspec: {kernel: {image: x, environ: {BACKENDAI_X: '1'}}}",
     "Reserved environment variable names: BACKENDAI_X"),
    ("[]", "holds no template"),
    ("just text", "A template is a mapping"),
])
def test_bad_template_documents_are_refused_with_the_reason(payload, message):
    with pytest.raises(DomainError) as caught:  # a TemplateError, or the spec's own
        parse_payload(payload)
    assert message in str(caught.value)


def test_payloads_in_json_in_a_list_and_in_the_managers_wrapper():
    document = yaml.safe_load(TEMPLATE_YAML)
    assert parse_payload(json.dumps(document)) == [("py-job", document)]
    assert [name for name, _ in parse_payload([document, document])] == ["py-job", "py-job"]
    wrapped = {"session_templates": [{"name": "renamed", "template": document}]}
    assert parse_payload(json.dumps(wrapped)) == [("renamed", document)]


# Templates: the routes, as the clients' `session-template` commands call them.

def test_template_round_trip_through_the_routes(client, kp):
    created = store(client, kp)
    assert len(created) == 1 and set(created[0]) == {"id", "user"}
    template_id = created[0]["id"]
    template = SessionTemplate.objects.get(pk=template_id)
    assert template.user == kp.user and template.name == "py-job"
    assert template.project.name == "default"

    listed = signed_call(client, kp, "GET", "/template/session", {"all": False}).json()
    assert [(t["id"], t["name"], t["is_owner"], t["type"]) for t in listed] == [
        (template_id, "py-job", True, "task")]
    assert {"created_at", "user", "group"} <= set(listed[0])

    as_yaml = signed_call(client, kp, "GET", f"/template/session/{template_id}?format=yaml")
    assert as_yaml.status_code == 200, as_yaml.content
    assert as_yaml["Content-Type"].startswith("text/yaml")
    assert yaml.safe_load(as_yaml.content) == yaml.safe_load(TEMPLATE_YAML)
    as_json = signed_call(client, kp, "GET", f"/template/session/{template_id}?format=json")
    assert as_json.json() == yaml.safe_load(TEMPLATE_YAML)

    changed = TEMPLATE_YAML.replace("name: py-job", "name: py-job-2")
    updated = signed_call(client, kp, "PUT", f"/template/session/{template_id}",
                          {"payload": changed})
    assert updated.status_code == 200 and updated.json() == {"success": True}
    assert SessionTemplate.objects.get(pk=template_id).name == "py-job-2"

    deleted = signed_call(client, kp, "DELETE", f"/template/session/{template_id}")
    assert deleted.json() == {"success": True}
    assert not SessionTemplate.objects.exists()
    gone = signed_call(client, kp, "GET", f"/template/session/{template_id}")
    assert gone.status_code == 404 and gone.json()["type"].endswith("/task-template-not-found")


def test_another_users_template_is_not_found_and_not_listed(client, kp, others):
    bob_kp, admin_kp = others
    template_id = store(client, kp)[0]["id"]
    for method, body in (("GET", None), ("PUT", {"payload": TEMPLATE_YAML}),
                         ("DELETE", None)):
        response = signed_call(client, bob_kp, method, f"/template/session/{template_id}",
                               body)
        assert response.status_code == 404, (method, response.content)
    assert signed_call(client, bob_kp, "GET", "/template/session").json() == []
    refused = signed_call(client, bob_kp, "POST", "/session/_/create-from-template",
                          {"template_id": template_id, "name": "stolen", "enqueueOnly": True})
    assert refused.status_code == 404
    # An admin sees everyone's with `all`, and may read it.
    assert signed_call(client, admin_kp, "GET", "/template/session").json() == []
    everyone = signed_call(client, admin_kp, "GET", "/template/session", {"all": True}).json()
    assert [t["id"] for t in everyone] == [template_id] and not everyone[0]["is_owner"]
    assert signed_call(client, admin_kp, "GET",
                       f"/template/session/{template_id}").status_code == 200


def test_storing_a_bad_template_is_a_400_naming_the_problem(client, kp):
    response = signed_call(client, kp, "POST", "/template/session", {
        "payload": "metadata: {name: a}\nspec: {kernel: {image: x, environ: {PATH: /x}}}"})
    assert response.status_code == 400
    assert "Reserved environment variable names: PATH" in response.json()["msg"]
    missing = signed_call(client, kp, "POST", "/template/session", {})
    assert missing.status_code == 400 and "payload" in missing.json()["msg"]
    assert not SessionTemplate.objects.exists()


def test_create_from_template_lays_the_requests_values_over_the_template(client, kp):
    template_id = store(client, kp)[0]["id"]
    # As the SDK sends it: unset options are left out or null.
    response = signed_call(client, kp, "POST", "/session/_/create-from-template", {
        "template_id": template_id, "name": "from-tpl", "enqueueOnly": True,
        "image": None, "tag": None, "startupCommand": "echo overridden", "dependencies": None,
        "config": {"environ": {"EXTRA": "1"}}, "reuseIfExists": True})
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "PENDING"
    session = Session.objects.get(pk=response.json()["sessionId"])
    assert (session.name, session.image, session.session_type) == ("from-tpl", IMAGE, "batch")
    assert session.startup_command == "echo overridden"
    assert session.bootstrap_script == "echo boot" and session.tag == "nightly"
    # config objects are merged key by key: the request's environ replaces the template's.
    assert session.environ == {"EXTRA": "1"}
    assert session.requested_slots == {"cpu": "1", "mem": str(128 * 2**20)}


# The dashboard's create form starts from a template.

def test_the_dashboard_form_starts_from_one_of_the_users_templates(client, alice, bob, kp):
    template = SessionTemplate.objects.create(
        name="py-job", user=alice, project=default_project(),
        template=yaml.safe_load(TEMPLATE_YAML))
    SessionTemplate.objects.create(name="bobs", user=bob, project=template.project,
                                   template=template.template)
    client.force_login(alice)
    page = client.get(f"/sessions/new/?template={template.pk}")
    assert page.status_code == 200
    form = page.context["form"]
    assert form.initial["image"] == IMAGE and form.initial["session_type"] == "batch"
    assert form.initial["startup_command"] == "echo $GREETING" and form.initial["mem"] == 128
    assert [label for _, label in form.fields["template"].choices] == ["None", "py-job"]
    html = page.content.decode()
    assert 'id="template-picker"' in html and "bobs" not in html

    created = client.post("/sessions/new/", {
        "template": str(template.pk), "name": "dash-tpl", "image": IMAGE,
        "session_type": "batch", "cpu": "1", "mem": "128", "cluster_size": "1",
        "startup_command": "echo $GREETING"})
    assert created.status_code == 302, page.context["form"].errors
    session = Session.objects.get(name="dash-tpl")
    assert session.environ == {"GREETING": "hello"} and session.bootstrap_script == "echo boot"


# destroy, dependency graph, bootstrap and environ, the batch timeout.

def test_destroy_answers_stats_with_status_as_the_clients_read_it(client, kp, alice):
    make_session(alice, Status.RUNNING, name="busy")
    waiting = make_session(alice, name="waiting")
    busy = Session.objects.get(name="busy")
    Kernel.objects.filter(session=busy).update(
        last_stat={"mem_bytes": 1048576, "mem_limit": 2**28, "cpu_percent": 1.5,
                   "usage": {"cpu": 1.0}})
    body = signed_call(client, kp, "DELETE", "/session/busy").json()
    assert body["status"] == "terminating"  # 23.9.10 read this; kept
    assert body["stats"] == {
        "status": "terminated", "version": 2,
        "mem": {"current": "1048576", "unit_hint": "bytes"},
        "cpu_util": {"current": "1.50", "pct": "1.50", "unit_hint": "percent"}}
    body = signed_call(client, kp, "DELETE", f"/session/{waiting.pk}").json()
    assert body["stats"] == {"status": "cancelled", "version": 2}


def test_the_dependency_graph_as_show_graph_reads_it(client, kp, others, alice):
    base = make_session(alice, Status.RUNNING, name="job-base-1")
    middle = make_session(alice, name="job-middle-1", dependencies=[base])
    top = make_session(alice, name="job-top-1", dependencies=[middle, base])
    graph = signed_call(client, kp, "GET", "/session/job-top-1/dependency-graph").json()
    assert graph["session_id"] == str(top.pk) and graph["session_name"] == "job-top-1"
    assert graph["status"] == "KernelStatus.PENDING"
    assert [d["session_name"] for d in graph["depends_on"]] == ["job-base-1", "job-middle-1"]
    middle_node = graph["depends_on"][1]
    assert [d["session_name"] for d in middle_node["depends_on"]] == ["job-base-1"]
    assert graph["depends_on"][0]["status"] == "KernelStatus.RUNNING"
    # The clients cut the time at its dot and parse "%Y-%m-%d %H:%M:%S".
    assert len(graph["status_changed"].split(".")[0]) == 19
    other = signed_call(client, others[0], "GET", f"/session/{top.pk}/dependency-graph")
    assert other.status_code == 404


def test_bootstrap_and_environ_go_from_the_create_body_to_the_main_kernels_command(
        client, kp):
    response = signed_call(client, kp, "POST", "/session", {
        "image": IMAGE, "name": "boot", "enqueueOnly": True, "clusterSize": 2,
        "bootstrap_script": "echo booted > /tmp/b", "config": {"environ": {"A": "1", "B": 2}}})
    assert response.status_code == 201, response.content
    session = Session.objects.get(name="boot")
    assert session.environ == {"A": "1", "B": "2"}
    info = signed_call(client, kp, "GET", "/session/boot").json()
    assert info["environ"] == {"A": "1", "B": "2"}
    main, sub = session.kernels.order_by("cluster_role")
    assert main.is_main and not sub.is_main
    main_spec, sub_spec = rpc.kernel_spec(main), rpc.kernel_spec(sub)
    assert main_spec["bootstrap_script"] == "echo booted > /tmp/b"
    assert sub_spec["bootstrap_script"] == ""  # once, in the main kernel only
    assert main_spec["environ"] == sub_spec["environ"] == {"A": "1", "B": "2"}
    command = kernel_command(main_spec)[-1]
    assert command.index("echo booted") < command.index("busy()")  # before the keep-alive
    assert BOOTSTRAP_MARK in command  # skipped when the container restarts
    assert "echo booted" not in kernel_command(sub_spec)[-1]
    environment = kernel_environment({**main_spec, "environ": {"A": "1"}})
    assert environment["A"] == "1" and environment["BACKENDAI_SESSION_NAME"] == "boot"


def test_a_batch_commands_exit_code_is_kept_after_its_bootstrap():
    spec = {"session_type": SessionType.BATCH, "startup_command": "exit 3",
            "bootstrap_script": "exit 9"}
    command = kernel_command(spec)
    assert command[:2] == ["/bin/sh", "-c"]
    # The bootstrap runs in a subshell; the command's own exit is the container's.
    assert command[2].endswith("fi; exit 3") and "( exit 9\n)" in command[2]


def test_a_batch_session_stopped_at_its_batch_timeout_failed(alice):
    session = make_session(alice, Status.RUNNING, name="slow", session_type="batch",
                           startup_command="sleep 60", batch_timeout=1)
    destroy_session(session, reason="batch-timeout")
    kernel = session.main_kernel
    handle_kernel_event(kernel.pk, "kernel_terminated",
                        {"exit_code": 143, "agent_id": kernel.agent_id, "log_tail": "x"})
    session.refresh_from_db()
    assert session.status == Status.TERMINATED and session.result == SessionResult.FAILURE
    failure = SessionEvent.objects.get(session=session, name="session_failure")
    assert failure.reason.startswith("batch-timeout") and failure.data == {"exit_code": 143}


def test_a_batch_session_a_user_stops_gets_no_result(alice):
    session = make_session(alice, Status.RUNNING, name="stopped", session_type="batch",
                           startup_command="sleep 60")
    destroy_session(session, reason="user-requested")
    kernel = session.main_kernel
    handle_kernel_event(kernel.pk, "kernel_terminated", {"exit_code": 143})
    assert not SessionEvent.objects.filter(session=session,
                                           name__in=["session_failure", "session_success"])


def test_the_batch_create_waits_for_the_end_and_interactive_for_the_start():
    assert Status.RUNNING not in ENDED and Status.RUNNING in STARTED_OR_ENDED
    assert {Status.TERMINATED, Status.CANCELLED, Status.ERROR} <= ENDED


# JSON errors on every path a client may call.

@pytest.mark.parametrize("path", ["/nowhere", "/template/nowhere", "/stream/session/x/y",
                                  "/sessions/nowhere/", "/folders/x/y/z"])
def test_unknown_paths_are_json_404s_for_clients(client, db, path):
    response = client.get(path, headers={"Accept": "*/*"})
    assert response.status_code == 404
    assert response.json()["type"].endswith("/object-not-found"), response.content


def test_browsers_keep_html_pages_on_dashboard_paths_only(client, db):
    html = {"Accept": "text/html,application/xhtml+xml"}
    for path in ("/nowhere/", "/sessions/nowhere/"):
        page = client.get(path, headers=html)
        assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
    api = client.get("/template/nowhere", headers=html)
    assert api.status_code == 404 and api.json()["msg"] == "There is no /template/nowhere."


def test_a_wrong_method_is_a_json_405(client, kp):
    response = signed_call(client, kp, "PATCH", "/template/session")
    assert response.status_code == 405 and response.json()["type"].endswith(
        "/method-not-allowed")


def test_html_error_pages_become_json_keeping_their_headers(db):
    request = RequestFactory().get("/anything", HTTP_ACCEPT="application/json")
    page = HttpResponseServerError("<h1>Server Error (500)</h1>", content_type="text/html")
    answer = as_json_error(request, page)
    assert answer.status_code == 500 and json.loads(answer.content)["msg"].startswith(
        "Internal server error")
    empty_405 = HttpResponse(status=405, headers={"Allow": "GET"})
    answer = as_json_error(request, empty_405)
    assert answer["Allow"] == "GET" and json.loads(answer.content)["msg"] == \
        "GET is not allowed on /anything."
    plain = HttpResponse("not found here", status=404, content_type="text/plain")
    assert as_json_error(request, plain) is plain  # a body of its own is kept


def test_the_api_takes_and_shows_environ_and_bootstrap_script(client, alice):
    client.force_login(alice)
    response = client.post("/api/v1/sessions/", {
        "name": "api-env", "image": IMAGE, "environ": {"A": "1"},
        "bootstrap_script": "echo hi"}, content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["environ"] == {"A": "1"}
    assert response.json()["bootstrap_script"] == "echo hi"
    refused = client.post("/api/v1/sessions/", {
        "name": "api-env2", "image": IMAGE, "environ": {"HOME": "/x"}},
        content_type="application/json")
    assert refused.status_code == 400
    assert "Reserved environment variable names: HOME" in refused.json()["msg"]
