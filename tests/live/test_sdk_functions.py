"""The 26.9.6 SDK's functions, class by class, run by its own Python (sdk_functions.py)
against the running system (web process, manager worker, agent on Docker): ComputeSession
(this part's functions), SessionTemplate, Resource, Image, Agent, KeyPair,
KeypairResourcePolicy, Manager and Admin.query. Each call either works or answers a JSON
error that says it is not supported and why. The CLI's `admin manager` and `session ls`
run with both client releases. The routes' shapes without Docker: tests/test_compat_sdk.py
and tests/test_graphql_sdk.py."""

import json
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine

from agents_app.models import Image
from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app import idle, tasks
from scheduling_app.models import ResourcePreset
from scheduling_app.scheduler import schedule
from sessions_app.enums import Status
from sessions_app.models import ManagerState, Session, SessionTemplate
from tests.support import IMAGE, wait_for

pytestmark = pytest.mark.docker
SCRIPT = Path(__file__).with_name("sdk_functions.py")
S = Status
NOT_IMPLEMENTED = "https://api.backend.ai/probs/not-implemented"


@pytest.fixture
def sdk(web_server, live, client_forkservers, tmp_path):
    """Runs one class's functions with the 26.9.6 SDK as the owner of `keypair`: answers
    {call label: its JSON line}."""

    def run(keypair, cls, *args, timeout=240):
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
               "BACKEND_ENDPOINT": web_server.url, "BACKEND_ENDPOINT_TYPE": "api",
               "BACKEND_ACCESS_KEY": keypair.access_key,
               "BACKEND_SECRET_KEY": keypair.secret_key}
        try:
            done = client_forkservers.python("26.9.6", [SCRIPT, cls, *args], env,
                                             timeout=timeout, tmp_path=tmp_path)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{cls} did not finish in {timeout}s; it said:\n{exc.stdout}"
                        f"{exc.stderr}")
        assert done.returncode == 0, done.stdout + done.stderr
        calls = {}
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                calls[entry["call"]] = entry
        return calls
    return run


def result(calls, label):
    assert "result" in calls[label], calls[label]
    return calls[label]["result"]


def refused(calls, label, status, words):
    entry = calls[label]
    assert entry.get("status") == status, entry
    assert words in json.dumps(entry["error"]), entry
    return entry["error"]


def not_supported(calls, label, words):
    error = refused(calls, label, 501, words)
    assert error["type"] == NOT_IMPLEMENTED and error["msg"].startswith(
        "Not supported by this server: ")


def graphql_refused(calls, label, words):
    entry = calls[label]
    assert entry.get("status") == 400, entry
    assert "is not supported by this server" in json.dumps(entry["error"]), entry
    assert words in json.dumps(entry["error"]), entry


@pytest.mark.timeout(600)
def test_compute_session_functions(sdk, alice):
    calls = sdk(main_keypair(alice), "compute-session", "sdk-cs")
    assert result(calls, "hello")["version"] == "v8.20240915"
    created = result(calls, "created")
    assert created["status"] == "RUNNING"
    session = Session.objects.get(pk=created["id"])
    assert result(calls, "get_info")["sessionName"] == "sdk-cs"
    detail = result(calls, "detail")  # the Relay node, flattened by the SDK
    assert detail["id"] == created["id"] and detail["name"] == "sdk-cs"
    assert [k["agent_id"] for k in detail["kernels"]] == [session.main_kernel.agent_id]
    assert detail["image_references"] == [IMAGE]
    listed = result(calls, "paginated_list")
    assert created["id"] in [item.get("session_id", item.get("id")) for item in listed["items"]]
    assert "logs" in result(calls, "get_logs")["result"]
    assert "RUNNING" in result(calls, "get_status_history")["result"]
    assert result(calls, "get_dependency_graph")["session_name"] == "sdk-cs"
    # list_files: what `session ls` prints, by the storage folders' path rules.
    listing = result(calls, "list_files")
    files = json.loads(listing["files"])
    assert [(f["filename"], f["size"]) for f in files] == [("hello.txt", 12)]
    assert {"mode", "mtime", "ctime", "atime"} <= set(files[0]) and listing["errors"] == ""
    assert "sub" in [f["filename"] for f in json.loads(result(calls, "list_files_home")["files"])]
    refused(calls, "list_files_outside", 400, "not absolute")
    assert result(calls, "stream_app_info") == []
    assert result(calls, "get_abusing_report") == {}
    assert result(calls, "update")["item"] == {"name": "sdk-cs", "priority": 3}
    assert isinstance(result(calls, "get_task_logs"), str)
    not_supported(calls, "interrupt", "no kernel runner to interrupt")
    not_supported(calls, "complete", "no kernel runner to interrupt")
    not_supported(calls, "start_service", "open /sessions/ID/apps/NAME/")
    assert result(calls, "restart") is None
    assert result(calls, "destroy")["stats"]["status"] == "terminated"
    session.refresh_from_db()
    assert (session.name, session.priority) == ("sdk-cs-r", 3)


@pytest.mark.timeout(600)
def test_a_batch_timeout_from_the_sdk_ends_the_session_and_starts_at_waits_for_its_time(
        sdk, alice, django_capture_on_commit_callbacks):
    calls = sdk(main_keypair(alice), "compute-session-batch", "sdk-b", "1m")
    assert result(calls, "batch") == "PENDING"
    timed = Session.objects.get(name="sdk-b")
    assert timed.batch_timeout == 3  # "3s", sent only to an API v8 manager
    wait_for(lambda: Session.objects.get(pk=timed.pk).status == S.RUNNING, timeout=120,
             message="the batch session to run")

    def stopped_by_its_timeout():  # what beat's idle check does every 15 s
        return timed.pk in idle.check_idle()

    wait_for(stopped_by_its_timeout, timeout=60, message="the batch timeout to stop it")
    wait_for(lambda: Session.objects.get(pk=timed.pk).status == S.TERMINATED, timeout=60,
             message="the timed-out session to end")
    assert timed.events.filter(reason__startswith="batch-timeout: stopped after").exists()

    # starts_at one minute ahead: PENDING, saying so; the live scheduler leaves it alone.
    info = result(calls, "later_info")
    later = Session.objects.get(name="sdk-b-later")
    assert info["status"] == "PENDING"
    assert info["statusData"]["scheduler"]["failed_predicates"][0]["name"] == "reserved_time"
    assert timedelta(seconds=50) < later.not_before - later.created_at < timedelta(seconds=70)
    schedule("default")
    assert Session.objects.get(pk=later.pk).status == S.PENDING
    # The pass a minute on (the clock driven, not waited for): the real agent runs it.
    with time_machine.travel(later.not_before + timedelta(seconds=1), tick=False), \
            django_capture_on_commit_callbacks(execute=True):
        assert tasks.schedule("default") == 1  # beat's task: placed, its image asked for
    wait_for(lambda: Session.objects.get(pk=later.pk).status == S.TERMINATED, timeout=120,
             message="the session that started at its time to finish")
    assert Session.objects.get(pk=later.pk).result == "success"


@pytest.mark.timeout(300)
def test_admins_place_a_session_on_a_named_agent_users_may_not(sdk, live, alice, carol):
    calls = sdk(main_keypair(carol), "compute-session-agents", "sdk-on", live.agent_id)
    assert result(calls, "assign_agent") == "RUNNING"
    assert Session.objects.get(name="sdk-on").main_kernel.agent_id == live.agent_id
    calls = sdk(main_keypair(alice), "compute-session-agents", "sdk-on2", live.agent_id)
    refused(calls, "assign_agent", 403, "Only administrators may place a session on named "
                                        "agents")


@pytest.mark.timeout(300)
def test_session_template_functions_with_the_sdks_list_form(sdk, alice):
    calls = sdk(main_keypair(alice), "session-template", "sdk-tpl")
    [listed] = result(calls, "list_templates")
    assert (listed["id"], listed["name"], listed["user"]) == (
        result(calls, "create"), "sdk-tpl", str(alice.pk))
    assert "taskTemplate" in result(calls, "get")
    assert result(calls, "put") == {"success": True}
    assert result(calls, "create_from_template") == "PENDING"
    made = Session.objects.get(name="sdk-tpl-s")
    assert made.environ == {"FROM": "template"} and made.tag == "changed"
    assert result(calls, "delete") == {"success": True}
    assert not SessionTemplate.objects.exists()


@pytest.mark.timeout(300)
def test_resource_functions_with_a_preset_check(sdk, live, alice, carol):
    ResourcePolicy.objects.filter(name="default").update(
        total_resource_slots={"cpu": "1", "mem": "1g"})
    ResourcePreset.objects.create(name="fits", resource_slots={"cpu": "0.5", "mem": "256m"})
    ResourcePreset.objects.create(name="too-big", resource_slots={"cpu": "2", "mem": "512m"})
    calls = sdk(main_keypair(alice), "resource", "default")
    assert [p["name"] for p in result(calls, "list")["presets"]] == ["fits", "too-big"]
    checked = result(calls, "check_presets")
    assert {p["name"]: p["allocatable"] for p in checked["presets"]} == {
        "fits": True, "too-big": False}
    assert checked["keypair_limits"]["cpu"] == "1"
    assert checked["scaling_groups"]["default"]["available"]["cpu"] == "1"
    assert result(calls, "get_resource_slots") == {"cpu": "count", "mem": "bytes"}
    assert result(calls, "get_vfolder_types") == ["user", "group"]
    registries = result(calls, "get_container_registries")  # where the agent's images are from
    assert all(r["hostname"] == name for name, r in registries.items())
    assert result(calls, "get_docker_registries") == registries
    refused(calls, "recalculate_usage", 403, "Only administrators")
    # Usage: a user reads their own month; every project's is for superadmins.
    for label in ("usage_per_month", "usage_per_period", "admin_monthly_stats"):
        refused(calls, label, 403, "Only superadmins")
    assert isinstance(result(calls, "user_monthly_stats"), list)
    calls = sdk(main_keypair(carol), "resource", "default")
    assert result(calls, "recalculate_usage") == {"corrected": {"agents": [], "keypairs": []}}
    for label in ("usage_per_month", "usage_per_period", "admin_monthly_stats"):
        assert isinstance(result(calls, label), list), label


@pytest.mark.timeout(300)
def test_image_and_agent_functions(sdk, live, carol):
    image = Image.objects.get(name=IMAGE)
    calls = sdk(main_keypair(carol), "image", str(image.pk))
    assert {"name": "bai-local/busybox", "tag": "latest", "architecture": "x86_64"} in [
        {k: i[k] for k in ("name", "tag", "architecture")} for i in result(calls, "list")]
    assert result(calls, "get")["tag"] == "latest"
    assert result(calls, "get_by_id")["name"] == "bai-local/busybox"
    # Images made from users' sessions (sdk-runner's commit labels them); on a shared
    # Docker engine there may be others' too.
    assert sorted(f"{i['name']}:{i['tag']}" for i in result(calls, "list_customized")) == \
        sorted(Image.objects.filter(labels__has_key="ai.backend.customized-image.owner")
               .values_list("name", flat=True))
    graphql_refused(calls, "rescan_images", "there is no registry to scan")
    for label in ("forget_image", "forget_image_by_id"):
        graphql_refused(calls, label, "a forgotten image would be back")
    graphql_refused(calls, "purge_image_by_id", "docker rmi")
    graphql_refused(calls, "untag_image_from_registry", "does not write to registries")
    graphql_refused(calls, "alias_image", "named by their reference only")
    graphql_refused(calls, "dealias_image", "named by their reference only")
    calls = sdk(main_keypair(carol), "agent", live.agent_id)
    assert live.agent_id in [a["id"] for a in result(calls, "paginated_list")["items"]]
    assert result(calls, "detail")["id"] == live.agent_id


@pytest.mark.timeout(300)
def test_keypair_and_resource_policy_functions(sdk, alice, carol):
    calls = sdk(main_keypair(carol), "keypair", "alice@example.com")
    made = result(calls, "create")
    assert made["ok"], made
    access_key = made["keypair"]["access_key"]
    for label in ("update", "deactivate", "activate"):
        assert result(calls, label) == {"ok": True, "msg": "success"}
    assert access_key in [k["access_key"] for k in result(calls, "list")]
    assert access_key in [k["access_key"] for k in result(calls, "paginated_list")["items"]]
    assert result(calls, "info")["access_key"] == main_keypair(carol).access_key
    assert result(calls, "delete") == {"ok": True, "msg": "success"}
    assert not KeyPair.objects.filter(pk=access_key).exists()
    refused_for_users = sdk(main_keypair(alice), "keypair", "alice@example.com")
    assert "Only administrators" in json.dumps(refused_for_users["create"])

    calls = sdk(main_keypair(carol), "keypair-resource-policy", "sdk-policy")
    made = result(calls, "create")
    assert made["ok"] and made["resource_policy"] == {"name": "sdk-policy"}
    assert "not applied here" in made["msg"]
    assert result(calls, "update")["ok"]
    assert "sdk-policy" in [p["name"] for p in result(calls, "list")]
    info = result(calls, "info")
    assert (info["idle_timeout"], json.loads(info["total_resource_slots"])) == (
        1200, {"cpu": "4", "mem": str(4 * 2**30)})
    assert result(calls, "delete") == {"ok": True, "msg": "success"}


@pytest.mark.timeout(600)
def test_manager_functions_and_a_frozen_manager(sdk, live, alice, carol):
    admin, user = main_keypair(carol), main_keypair(alice)
    calls = sdk(admin, "manager", live.agent_id)
    assert result(calls, "status")["status"] == "running"
    assert result(calls, "update_announcement") is None
    assert result(calls, "get_announcement") == {"enabled": True,
                                                 "message": "Maintenance at 18:00"}
    assert result(calls, "scheduler_op") is None and result(calls, "scheduler_op_back") is None
    result(sdk(user, "manager", "create"), "create")
    session = Session.objects.get(keypair=user)
    wait_for(lambda: Session.objects.get(pk=session.pk).status == S.RUNNING, timeout=120,
             message="a session to run before the freeze")

    assert result(sdk(admin, "manager", "freeze"), "freeze") is None
    assert ManagerState.objects.get().status == "frozen"
    error = refused(sdk(user, "manager", "create"), "create", 503, "frozen")
    assert error["type"] == "https://api.backend.ai/probs/server-frozen"
    assert Session.objects.get(pk=session.pk).status == S.RUNNING  # kept
    assert Session.objects.filter(keypair=user).count() == 1
    assert result(sdk(admin, "manager", "unfreeze"), "unfreeze") is None
    result(sdk(user, "manager", "create"), "create")
    assert Session.objects.filter(keypair=user).count() == 2


@pytest.mark.timeout(300)
def test_admin_query_runs_what_the_script_asks(sdk, alice):
    calls = sdk(main_keypair(alice), "admin", "{ keypair { access_key is_admin } }")
    assert result(calls, "query") == {"keypair": {"access_key": main_keypair(alice).access_key,
                                                 "is_admin": False}}


# The CLI of both releases: `admin manager` and `session ls`.

@pytest.mark.timeout(600)
def test_the_cli_freezes_and_unfreezes_the_manager(backendai, alice, carol):
    admin = main_keypair(carol)
    code, out = backendai(admin, "admin", "manager", "freeze")
    assert code == 0 and "Manager is successfully frozen." in out, out
    code, out = backendai(admin, "admin", "manager", "status")
    assert code == 0 and "frozen" in out, out
    code, out = backendai(main_keypair(alice), "create", "--name", "cli-frozen", "-r",
                          "cpu=0.5", "-r", "mem=128m", IMAGE)
    assert code != 0 and "frozen" in out.lower(), out
    code, out = backendai(admin, "admin", "manager", "unfreeze")
    assert code == 0 and "Manager is successfully unfrozen." in out, out


@pytest.mark.timeout(600)
def test_the_cli_lists_a_sessions_files(backendai, alice, tmp_path):
    keypair = main_keypair(alice)
    code, out = backendai(keypair, "create", "--name", "cli-ls", "-r", "cpu=0.5", "-r",
                          "mem=128m", IMAGE)
    assert code == 0, out
    (tmp_path / "hello.txt").write_text("hello")
    code, out = backendai(keypair, "session", "upload", "cli-ls", "hello.txt", cwd=tmp_path)
    assert code == 0, out
    code, out = backendai(keypair, "session", "ls", "cli-ls")
    assert code == 0, out
    row = next(line.split() for line in out.splitlines() if line.startswith("hello.txt"))
    assert row[1:3] == ["5", "Bytes"] and row[-1] == "-rw-r--r--", out


@pytest.mark.parametrize("release, negotiated", [("26.9.6", "(8, '20240915')"),
                                                 ("23.9.10", "(7, '20230615')")])
def test_each_client_negotiates_its_api_version_and_the_older_one_advises_an_upgrade(
        web_server, live, alice, client_forkservers, tmp_path, release, negotiated):
    keypair = main_keypair(alice)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BACKEND_ENDPOINT": web_server.url,
           "BACKEND_ENDPOINT_TYPE": "api", "BACKEND_ACCESS_KEY": keypair.access_key,
           "BACKEND_SECRET_KEY": keypair.secret_key}
    code = ("from ai.backend.client.session import Session\n"
            "with Session() as api:\n    print(api.api_version)\n")
    done = client_forkservers.python(release, ["-c", code], env, tmp_path=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == negotiated, done
    advice = "The server API version is higher than the client." in done.stderr
    assert advice == (release == "23.9.10"), done.stderr
