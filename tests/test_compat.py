"""The Backend.AI-compatible routes at the server root, through Django's test client.

The real `backend.ai` CLI against a running server is in test_compat_cli.py; here are the
request and response shapes, the lookups and the refusals, without Docker.
"""

import shlex
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents_app.models import Image
from agents_app.runtime import python_query
from common import clock
from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair
from sessions_app.enums import Status
from sessions_app.models import Session, SessionEvent
from tests.factories import make_agent, make_session
from tests.signing import signed_call

IMAGE = "bai-local/busybox:latest"


@pytest.fixture
def kp(alice):
    return main_keypair(alice)


def create(client, keypair, **body):
    body = {"image": IMAGE, "enqueueOnly": True, **body}
    return signed_call(client, keypair, "POST", "/session", body)


def test_version_root_answers_json_to_clients_and_redirects_browsers(client, db):
    assert client.get("/").json() == {"version": "v8.20240915", "manager": "0.1.0"}
    response = client.get("/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert response.status_code == 302 and response["Location"] == "/sessions/"


def test_create_in_the_sdk_shape(client, kp):
    response = create(client, kp, name="s1", type="interactive", clusterSize=1,
                      clusterMode="single-node", domain="default", group="default",
                      config={"resources": {"cpu": "1", "mem": "256m"}, "mounts": [],
                              "environ": {}, "scalingGroup": None}, tag="t",
                      startupCommand=None, reuseIfExists=True, maxWaitSeconds=0)
    assert response.status_code == 201, response.content
    body = response.json()
    session = Session.objects.get(pk=body["sessionId"])
    assert body == {"sessionId": str(session.pk), "sessionName": "s1", "status": "PENDING",
                    "servicePorts": [], "created": True}
    assert session.requested_slots == {"cpu": "1", "mem": str(256 * 2**20)}
    assert session.tag == "t" and session.keypair == kp
    assert response["X-RateLimit-Limit"] == str(kp.rate_limit)


def test_create_reuses_a_live_session_of_that_name_unless_told_not_to(client, kp):
    first = create(client, kp, name="s1").json()
    again = create(client, kp, name="s1")
    assert again.status_code == 200
    assert again.json() == {**first, "created": False}
    refused = create(client, kp, name="s1", reuseIfExists=False)
    assert refused.status_code == 409
    assert refused.json()["type"].endswith("/session-already-exists")
    assert refused.json()["data"] == {"existingSessionId": first["sessionId"]}
    other_image = create(client, kp, name="s1", image="other:latest")
    assert other_image.status_code == 400
    assert "already exists with another image" in other_image.json()["msg"]


def test_create_without_enqueue_only_waits_and_says_timeout(client, kp):
    response = create(client, kp, name="s1", enqueueOnly=False, maxWaitSeconds=1)
    assert response.status_code == 201
    assert response.json()["status"] == "TIMEOUT"  # no scheduler runs in this test


@pytest.mark.parametrize("body, message", [
    ({"name": "s1", "config": {"mounts": ["data"]}}, "There is no folder 'data' you may "
                                                      "mount."),
    ({"name": "s1", "config": {"preopen_ports": [8080]}}, "Not supported by this server: "
                                                           "config.preopen_ports"),
    ({"name": "s1", "config": {"environ": {"BACKENDAI_SESSION_ID": "x"}}},
     "Reserved environment variable names: BACKENDAI_SESSION_ID"),
    ({"name": "s1", "config": {"environ": {"PATH": "/x", "TINI_KILL_PROCESS_GROUP": "0"}}},
     "Reserved environment variable names: PATH, TINI_KILL_PROCESS_GROUP"),
    ({"name": "s1", "config": {"environ": {"1A": "x"}}}, "Not a variable name: '1A'"),
    ({"name": "s1", "config": {"environ": {"A": {"b": 1}}}}, "The value of A must be text"),
    ({"name": "s1", "config": {"environ": ["A=1"]}}, "environ must be an object"),
    ({"name": "s1", "bootstrap_script": 5}, "bootstrap_script must be a string"),
    ({"name": "s1", "type": "batch", "startupCommand": "true", "batch_timeout": 0},
     "batch_timeout must be a whole number of at least 1"),
    ({"name": "s1", "clusterSize": "many"}, "clusterSize must be a whole number"),
    ({"name": "s1", "config": "x"}, "config must be an object"),
    ({"name": "s1", "config": {"resources": {"cpu": "lots"}}}, "cpu: 'lots' is not a number"),
    ({"name": "bad name!"}, "A session name is 1 to 64"),
    ({"name": "s1", "type": "batch"}, "needs a startup command"),
    ({"name": "s1", "domain": "nowhere"}, "There is no active domain 'nowhere'"),
    ({"name": "s1", "dependencies": ["nope"]}, "There is no session 'nope' to depend on"),
    ({"name": 5}, "name must be a string"),
])
def test_bad_creates_are_json_errors(client, kp, body, message):
    response = create(client, kp, **body)
    assert 400 <= response.status_code < 500
    assert message in response.json()["msg"]
    assert {"type", "title", "msg"} <= set(response.json())
    assert Session.objects.count() == 0


def test_a_non_object_body_is_a_400(client, kp):
    response = signed_call(client, kp, "POST", "/session", ["a"])
    assert response.status_code == 400
    assert response.json()["msg"] == "The request body must be a JSON object."


def test_create_with_dependencies_by_name(client, kp, alice):
    make_session(alice, name="first")
    response = create(client, kp, name="second", dependencies=["first"])
    session = Session.objects.get(pk=response.json()["sessionId"])
    assert [d.name for d in session.dependencies.all()] == ["first"]


def test_info_status_history_and_logs_by_name(client, kp, alice):
    session = make_session(alice, Status.RUNNING, name="s1")
    info = signed_call(client, kp, "GET", "/session/s1").json()
    assert info["sessionId"] == str(session.pk) and info["status"] == "RUNNING"
    assert info["image"] == IMAGE and info["containerId"].startswith("c-")
    history = signed_call(client, kp, "GET", "/session/s1/status-history").json()["result"]
    assert list(history) == ["PENDING", "SCHEDULED", "PREPARING", "PREPARED", "CREATING",
                             "RUNNING"]
    finished = make_session(alice, Status.TERMINATED, name="done")
    finished.kernels.update(log_tail="the end\n")
    logs = signed_call(client, kp, "GET", "/session/done/logs")
    assert logs.json() == {"result": {"logs": "the end\n"}}


def test_lookup_by_name_prefers_the_live_session_then_the_latest_finished(client, kp, alice):
    make_session(alice, Status.CANCELLED, name="s1")
    newer_finished = make_session(alice, Status.CANCELLED, name="s1")
    assert signed_call(client, kp, "GET", "/session/s1").json()["sessionId"] == \
        str(newer_finished.pk)
    live = make_session(alice, name="s1")
    assert signed_call(client, kp, "GET", "/session/s1").json()["sessionId"] == str(live.pk)
    by_id = signed_call(client, kp, "GET", f"/session/{newer_finished.pk}").json()
    assert by_id["sessionId"] == str(newer_finished.pk)


def test_destroy_by_name_follows_the_lifecycle_rules(client, kp, admin_keypair, alice):
    make_session(alice, Status.PREPARING, name="busy")
    refused = signed_call(client, kp, "DELETE", "/session/busy")
    # Backend.AI's GenericForbidden (the REST API answers 409: test_destroy_rules.py).
    assert refused.status_code == 403
    assert refused.json()["type"] == "https://api.backend.ai/probs/generic-forbidden"
    assert refused.json()["title"] == "Forbidden operation."
    assert refused.json()["msg"].startswith("Cannot destroy kernels in scheduled/preparing/"
                                            "terminating/error status; PREPARING times out")
    forced = signed_call(client, kp, "DELETE", "/session/busy?forced=true")
    assert forced.status_code == 403
    assert forced.json()["msg"] == "You are not allowed to force-terminate"
    # An admin names the owner, as `backend.ai rm -f -o ACCESS_KEY NAME` does.
    done = signed_call(client, admin_keypair, "DELETE",
                       f"/session/busy?forced=true&owner_access_key={kp.access_key}")
    assert done.status_code == 200, done.content
    assert done.json()["status"] == "terminated"
    pending = make_session(alice, name="waiting")
    assert signed_call(client, kp, "DELETE", "/session/waiting").json()["status"] == \
        "cancelled"
    pending.refresh_from_db()
    assert pending.status == Status.CANCELLED


def test_recursive_destroy_cancels_the_dependents_too(client, kp, alice):
    base = make_session(alice, name="base")
    dependent = make_session(alice, name="dependent")
    dependent.dependencies.add(base)
    response = signed_call(client, kp, "DELETE", "/session/base?recursive=true")
    assert response.status_code == 200
    assert set(Session.objects.values_list("status", flat=True)) == {Status.CANCELLED}


def test_rename_keeps_names_unique_among_live_sessions(client, kp, alice):
    session = make_session(alice, name="old")
    make_session(alice, name="taken")
    clash = signed_call(client, kp, "POST", "/session/old/rename?name=taken")
    assert clash.status_code == 409
    assert clash.json()["msg"] == "You already have a live session named 'taken'."
    response = signed_call(client, kp, "POST", "/session/old/rename?name=new")
    assert response.status_code == 204
    session.refresh_from_db()
    assert session.name == "new"
    event = SessionEvent.objects.get(session=session, name="session_renamed")
    assert event.data == {"from": "old", "to": "new"}


def test_restart_needs_a_running_session(client, kp, alice):
    make_session(alice, name="pending")
    response = signed_call(client, kp, "PATCH", "/session/pending")
    assert response.status_code == 409
    assert "only a RUNNING session can be restarted" in response.json()["msg"]


def test_restart_records_the_request_and_asks_the_agent(client, kp, alice, monkeypatch,
                                                        django_capture_on_commit_callbacks):
    sent = []
    monkeypatch.setattr("agents_app.rpc._send", lambda agent, task, **kw: sent.append(
        (agent, task, kw)))
    session = make_session(alice, Status.RUNNING, name="s1")
    kernel = session.kernels.get()
    with django_capture_on_commit_callbacks(execute=True):
        response = signed_call(client, kp, "PATCH", "/session/s1")
    assert response.status_code == 204
    assert SessionEvent.objects.filter(session=session, name="session_restarting").exists()
    assert sent == [(kernel.agent_id, "agent.restart_kernel", {
        "kernel_id": str(kernel.pk), "container_id": kernel.container_id,
        "grace_period": 10})]


@pytest.fixture
def agent_steps(monkeypatch):
    """The requests execute makes to the kernel's agent (its run id and body), each answered
    with the next of `answers`."""
    class Steps(list):
        answers = []

    steps = Steps()

    async def execute_step(grant, body):
        steps.append((grant.target, body))
        return steps.answers.pop(0)

    monkeypatch.setattr("sessions_app.compat.views.execute_step", execute_step)
    make_agent(stream_addr="127.0.0.1:9")
    return steps


FINISHED = {"status": "finished", "console": [["stdout", "out\n"]], "exitCode": 3}


def test_execute_answers_in_the_sdk_result_format(client, kp, alice, agent_steps):
    make_session(alice, Status.RUNNING, name="s1")
    agent_steps.answers += [FINISHED, FINISHED]
    query = signed_call(client, kp, "POST", "/session/s1",
                        {"mode": "query", "code": "echo out; exit 3", "runId": None})
    assert query.status_code == 200, query.content
    result = query.json()["result"]
    assert result["status"] == "finished" and result["exitCode"] == 3
    assert result["console"] == [["stdout", "out\n"]] and result["runId"]
    batch = signed_call(client, kp, "POST", "/session/s1", {
        "mode": "batch", "code": "", "runId": "r1",
        "options": {"build": "make", "exec": "./run", "clean": None, "buildLog": False}})
    assert batch.json()["result"]["runId"] == "r1"
    assert [(target, body["command"], body["flush"]) for target, body in agent_steps] == [
        (f"exec:{result['runId']}", "echo out; exit 3", 2.0),
        ("exec:r1", "( make ) && ( ./run )", 2.0)]
    unknown = signed_call(client, kp, "POST", "/session/s1", {"mode": "input", "code": "x"})
    assert unknown.status_code == 400
    assert "Unsupported execution mode 'input'" in unknown.json()["msg"]


def test_a_command_has_the_rights_of_the_signed_keypair_not_the_main_one(
        client, alice, bob, agent_steps):
    """bob signing with an admin keypair of his runs a command in alice's session (the
    grant of the kernel's stream checked his main keypair, and refused it, before); his
    main keypair, no admin's, finds no session there."""
    session = make_session(alice, Status.RUNNING, name="s1")
    admin_key = KeyPair.objects.create(user=bob, is_admin=True,
                                       resource_policy=main_keypair(bob).resource_policy)
    agent_steps.answers += [FINISHED]
    body = {"mode": "query", "code": "id", "runId": None}
    ran = signed_call(client, admin_key, "POST", f"/session/{session.pk}", body)
    assert ran.status_code == 200, ran.content
    assert ran.json()["result"]["exitCode"] == 3
    refused = signed_call(client, main_keypair(bob), "POST", f"/session/{session.pk}", body)
    assert refused.status_code == 404


def test_a_long_run_is_continued_by_its_run_id(client, kp, alice, agent_steps):
    make_session(alice, Status.RUNNING, name="s1")
    agent_steps.answers += [
        {"status": "continued", "console": [["stdout", "a\n"]], "exitCode": None},
        {"status": "finished", "console": [], "exitCode": 0}]
    first = signed_call(client, kp, "POST", "/session/s1",
                        {"mode": "query", "code": "long()", "runId": "run-1"}).json()["result"]
    assert (first["status"], first["console"], first["exitCode"]) == (
        "continued", [["stdout", "a\n"]], None)
    then = signed_call(client, kp, "POST", "/session/s1",
                       {"mode": "continue", "code": "", "runId": "run-1"}).json()["result"]
    assert (then["status"], then["exitCode"], then["runId"]) == ("finished", 0, "run-1")
    assert agent_steps[1] == ("exec:run-1", {"flush": 2.0})  # no command: the next part
    without_id = signed_call(client, kp, "POST", "/session/s1", {"mode": "continue", "code": ""})
    assert without_id.status_code == 400 and "runId" in without_id.json()["msg"]
    bad_id = signed_call(client, kp, "POST", "/session/s1",
                         {"mode": "query", "code": "1", "runId": "a/b"})
    assert bad_id.status_code == 400 and "runId" in bad_id.json()["msg"]


def test_query_mode_on_a_python_image_runs_in_the_kernels_interpreter(client, kp, alice,
                                                                     agent_steps):
    make_session(alice, Status.RUNNING, name="s1")
    agent_steps.answers += [FINISHED] * 3
    for labels in ({"ai.backend.runtime-type": "python",
                    "ai.backend.runtime-path": "/usr/bin/python3"},
                   {"ai.backend.runtime-path": "/usr/local/bin/python3.12"},
                   {"ai.backend.runtime-path": "/usr/bin/ruby"}):
        Image.objects.filter(name=IMAGE).update(labels=labels)
        signed_call(client, kp, "POST", "/session/s1", {"mode": "query", "code": "print('hi')"})
    commands = [body["command"] for _target, body in agent_steps]
    assert [body["marked"] for _target, body in agent_steps] == [True, True, False]
    source = Path(python_query.__file__).read_text()
    assert commands[0] == f"exec /usr/bin/python3 -c {shlex.quote(source)} run " \
                          "'print('\"'\"'hi'\"'\"')'"
    assert commands[1].startswith("exec /usr/local/bin/python3.12 -c ")
    assert commands[2] == "exec /usr/bin/ruby -c 'print('\"'\"'hi'\"'\"')'"


def read_stream(response):
    async def collect():
        return [chunk async for chunk in response.streaming_content]
    return b"".join(async_to_sync(collect)()).decode()


def test_events_of_a_finished_session_replay_its_history_and_close(client, kp, alice):
    session = make_session(alice, Status.CANCELLED, name="s1")
    response = signed_call(client, kp, "GET", "/events/session?sessionName=s1&scope=*")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    body = read_stream(response)
    events = [line.split(": ", 1)[1] for line in body.splitlines() if line.startswith("event:")]
    assert events == ["session_enqueued", "kernel_cancelled", "session_cancelled",
                      "server_close"]
    assert f'"sessionId":"{session.pk}"' in body and f'"ownerAccessKey":"{kp.access_key}"' in body
    scoped = signed_call(client, kp, "GET", "/events/session?sessionName=s1&scope=kernel")
    body = read_stream(scoped)
    assert [line for line in body.splitlines() if line.startswith("event:")] == [
        "event: kernel_cancelled", "event: server_close"]


def test_an_admin_follows_another_users_session_by_id(client, admin_keypair, alice):
    session = make_session(alice, Status.CANCELLED, name="s1")
    response = signed_call(client, admin_keypair, "GET", f"/events/session?sessionId={session.pk}")
    events = [line for line in read_stream(response).splitlines() if line.startswith("event:")]
    assert events == ["event: session_enqueued", "event: kernel_cancelled",
                      "event: session_cancelled", "event: server_close"]


def test_bad_event_stream_parameters_are_json_errors(client, kp):
    response = signed_call(client, kp, "GET", "/events/session?scope=everything")
    assert response.status_code == 400
    assert response.json()["msg"] == "scope must be *, session or kernel."
    response = signed_call(client, kp, "GET", "/events/session?sessionId=nope")
    assert response.status_code == 400


def test_unknown_session_is_404_in_backendai_form(client, kp):
    response = signed_call(client, kp, "GET", "/session/nothing")
    assert response.status_code == 404
    assert response.json() == {"type": "https://api.backend.ai/probs/session-not-found",
                               "title": "No such object.",
                               "msg": "There is no session named 'nothing'."}


def test_unknown_compat_paths_are_json_404(client, db):
    response = client.get("/session/x/nothing")
    assert response.status_code == 404 and response.json()["msg"] == (
        "There is no /session/x/nothing.")
    response = client.get("/api/v1/kernels/a%0Ab/")  # found by schemathesis: an HTML 404
    assert response.status_code == 404 and response.json()["type"].endswith("/object-not-found")


# Whatever the SDK's bodies hold, the answer is a 2xx or a Backend.AI-form 4xx.

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=6)
CREATE_KEYS = ["name", "clientSessionToken", "image", "lang", "type", "clusterSize",
               "clusterMode", "startupCommand", "tag", "dependencies", "domain", "group",
               "owner_access_key", "reuseIfExists", "maxWaitSeconds", "bootstrap_script",
               "starts_at"]
CONFIG = st.fixed_dictionaries({}, optional={
    key: JSON for key in ("resources", "scalingGroup", "mounts", "environ", "agentList")})
CREATE_BODY = st.fixed_dictionaries(
    {"enqueueOnly": st.just(True)},  # never wait: no scheduler runs here
    optional={**{key: JSON for key in CREATE_KEYS}, "config": JSON | CONFIG,
              "name": st.sampled_from(["s1", "s-2", "x" * 65, ""]) | JSON,
              "image": st.just(IMAGE) | JSON})
EXECUTE_BODY = st.fixed_dictionaries({}, optional={
    "mode": st.sampled_from(["query", "batch", "continue", "input"]) | JSON,
    "code": st.text(max_size=20) | JSON, "runId": JSON,
    "options": JSON | st.fixed_dictionaries({}, optional={
        "build": st.text(max_size=8) | JSON, "exec": st.text(max_size=8) | JSON})})
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_answered_in_form(response):
    assert response.status_code < 500, response.content
    if response.status_code >= 400:
        assert {"type", "title", "msg"} <= set(response.json())


@FUZZ
@given(body=CREATE_BODY)
def test_any_create_body_is_answered_in_form(client, kp, body):
    assert_answered_in_form(signed_call(client, kp, "POST", "/session", body))


@FUZZ
@given(body=EXECUTE_BODY)
def test_any_execute_body_is_answered_in_form(client, kp, alice, monkeypatch, body):
    async def execute_step(grant, body):
        return FINISHED

    monkeypatch.setattr("sessions_app.compat.views.execute_step", execute_step)
    if not Session.objects.filter(name="fuzz").exists():
        make_agent(stream_addr="127.0.0.1:9")
        make_session(alice, Status.RUNNING, name="fuzz")
    assert_answered_in_form(signed_call(client, kp, "POST", "/session/fuzz", body))


def test_idle_reports_are_shown_with_reason_remaining_and_thresholds(client, kp, alice):
    session = make_session(alice, Status.RUNNING, name="s1")
    expires = clock.now() + timedelta(seconds=90)
    Session.objects.filter(pk=session.pk).update(status_data={"idle_checks": {
        "network-timeout": {"expires_at": expires.isoformat(), "warned": True},
        "utilization": {"expires_at": None, "averages": {"cpu": 40.0}}}})
    checks = signed_call(client, kp, "GET", "/session/s1").json()["idleChecks"]
    client.force_login(alice)
    api = client.get(f"/api/v1/sessions/{session.pk}/").json()["idle_checks"]
    assert api.keys() == checks.keys()
    for name, report in checks.items():  # the same, but for the clock between the calls
        assert {**api[name], "remaining": 0} == {**report, "remaining": 0}
    network = checks["network-timeout"]
    assert (network["reason"], network["remaining_time_type"], network["warned"]) == (
        "idle-timeout", "expire_after", True)
    assert 80 < network["remaining"] <= 90
    utilization = checks["utilization"]
    assert (utilization["reason"], utilization["remaining"]) == ("utilization-idle", None)
    assert utilization["thresholds"] == {"cpu": 1.0, "mem": 1.0}  # from the settings
    assert utilization["averages"] == {"cpu": 40.0}
