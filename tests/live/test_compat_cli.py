"""The real `backend.ai` CLI of two client releases (23.9.10 and 26.9.6, from PyPI, each in its
own venv: see `backendai_cli`) against the running system: the web process (backendai_web.serve), a
manager worker, an agent on Docker. Every test runs once with each client."""
import json
import re
import threading

import pytest

from identity_app.keypairs import main_keypair
from scheduling_app import idle
from sessions_app.enums import Status
from sessions_app.models import Session, SessionEvent, SessionTemplate
from tests.signing import SignedClient
from tests.support import IMAGE, wait_for

pytestmark = pytest.mark.docker


def session_named(name):
    return Session.objects.filter(name=name).order_by("-created_at").first()


def follow(process):
    """The lines `process` prints, as it prints them: (a list, the thread that fills it)."""
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    return lines, reader


def streamed_events(output):
    """(event name, data) of each line `backend.ai session events` printed."""
    found = []
    for line in output.splitlines():
        match = re.match(r"^(\w+) (\{.*\})$", line.strip())
        if match:
            found.append((match.group(1), json.loads(match.group(2))))
    return found


def test_the_cli_creates_follows_restarts_and_destroys_a_session(backendai, alice,
                                                                docker_client):
    kp = main_keypair(alice)
    code, out = backendai(kp, "create", "-t", "interactive", "--name", "cli1", "-r", "cpu=1",
                          "-r", "mem=256m", "--startup-command", "echo hello-from-kernel",
                          IMAGE)
    session = session_named("cli1")
    assert code == 0, out
    assert f"Session ID {session.pk} is created and ready." in out
    assert session.status == Status.RUNNING
    assert session.requested_slots == {"cpu": "1", "mem": str(256 * 2**20)}

    events = backendai.start(kp, "session", "events", "cli1")
    lines, reader = follow(events)
    # It follows "cli1" from its history on: before the rename below (a name that matches
    # no session yet waits for the first session of that name to appear).
    wait_for(lambda: any(line.startswith("session_enqueued ") for line in lines),
             timeout=60, message="the event stream's history")

    code, out = backendai(kp, "session", "logs", "cli1")
    assert code == 0 and "hello-from-kernel" in out and "End of logs." in out, out

    code, out = backendai(kp, "session", "status-history", "cli1")
    assert code == 0, out
    # 23.9.10 prints its pairs, 26.9.6 the mapping: each names the statuses quoted.
    assert "'PENDING'" in out and "'RUNNING'" in out

    container_id = session.kernels.get().container_id
    code, out = backendai(kp, "restart", "cli1")
    assert code == 0 and "Done." in out, out
    wait_for(lambda: SessionEvent.objects.filter(session=session,
                                                 name="kernel_restarted").exists(),
             timeout=60, message="kernel_restarted")
    assert docker_client.containers.get(container_id).status == "running"
    assert Session.objects.get(pk=session.pk).status == Status.RUNNING

    code, out = backendai(kp, "session", "rename", "cli1", "cli1-renamed")
    assert code == 0 and "Session renamed to cli1-renamed." in out, out

    code, out = backendai(kp, "rm", "-f", "cli1-renamed")
    assert code == 1, out
    assert "You are not allowed to force-terminate" in out
    assert Session.objects.get(pk=session.pk).status == Status.RUNNING

    code, out = backendai(kp, "rm", "--stats", "cli1-renamed")  # reads stats.status
    assert code == 0 and "Done." in out and "Error" not in out, out
    wait_for(lambda: Session.objects.get(pk=session.pk).status == Status.TERMINATED,
             message="TERMINATED")

    # The stream ends by itself (server_close) once the session has finished.
    events.wait(timeout=60)
    reader.join(timeout=10)
    out = "".join(lines)
    names = [name for name, _ in streamed_events(out)]
    assert names[0] == "session_enqueued"
    assert {"session_started", "session_restarting", "kernel_restarted", "session_renamed",
            "session_terminating", "kernel_terminated"} <= set(names)
    assert names[-2:] == ["session_terminated", "server_close"]
    data = dict(streamed_events(out))["session_terminated"]
    assert data["sessionId"] == str(session.pk) and data["ownerAccessKey"] == kp.access_key


def test_an_admin_force_terminates_a_users_session(backendai, alice, carol):
    user_kp, admin_kp = main_keypair(alice), main_keypair(carol)
    code, out = backendai(user_kp, "create", "--name", "cli2", IMAGE)
    assert code == 0, out
    code, out = backendai(user_kp, "rm", "-f", "cli2")
    assert code == 1 and "You are not allowed to force-terminate" in out, out
    code, out = backendai(admin_kp, "rm", "-f", "-o", user_kp.access_key, "cli2")
    assert code == 0 and "Done." in out, out
    session = session_named("cli2")
    wait_for(lambda: Session.objects.get(pk=session.pk).status == Status.TERMINATED,
             message="TERMINATED")
    assert Session.objects.get(pk=session.pk).status_info == "force-terminated"


def test_a_batch_sessions_exit_is_reported(backendai, alice, tmp_path):
    kp = main_keypair(alice)
    script = tmp_path / "bootstrap.sh"
    script.write_text("echo bootstrap-ran-$GREETING\n")
    code, out = backendai(kp, "create", "--type", "batch", "--name", "batch1",
                          "--bootstrap-script", str(script), "-e", "GREETING=hi",
                          "--startup-command", "echo batch-output-$GREETING; sleep 1; exit 3",
                          IMAGE)
    # Answered once the command has ended, with the final status (no enqueueOnly).
    assert code == 0 and "is already terminated" in out, out
    session = session_named("batch1")
    assert session.status == Status.TERMINATED and session.environ == {"GREETING": "hi"}
    code, out = backendai(kp, "session", "logs", "batch1")  # right away: not empty
    assert code == 0, out
    assert out.index("bootstrap-ran-hi") < out.index("batch-output-hi"), out
    code, out = backendai(kp, "session", "events", "batch1", timeout=60)
    events = dict(streamed_events(out))
    assert events["session_failure"]["exitCode"] == 3
    assert events["kernel_terminated"]["exitCode"] == 3
    assert "session_terminated" in events
    code, out = backendai(kp, "rm", "batch1")  # finished already: nothing changes
    assert code == 0, out


def test_a_batch_timeout_ends_the_session_with_a_failure_event(backendai, alice, web_server):
    kp = main_keypair(alice)
    # The clients send batch_timeout only to API v8 managers: the SDK's body, signed.
    created = SignedClient(web_server.url, kp.access_key, kp.secret_key).request(
        "POST", "/session", {"name": "slowbatch", "image": IMAGE, "type": "batch",
                             "startupCommand": "sleep 300", "batch_timeout": 2,
                             "enqueueOnly": True})
    assert created.status_code == 201, created.text
    session = session_named("slowbatch")
    wait_for(lambda: Session.objects.get(pk=session.pk).status == Status.RUNNING,
             message="RUNNING")

    def culled():
        idle.check_idle()  # the beat's pass, run here
        return Session.objects.get(pk=session.pk).status == Status.TERMINATED
    # 2 s of timeout, then SIGTERM within the default grace period; slow under load.
    wait_for(culled, timeout=90, interval=1, message="TERMINATED by batch-timeout")
    code, out = backendai(kp, "session", "events", "slowbatch", timeout=60)
    assert code == 0, out
    events = dict(streamed_events(out))
    assert events["session_failure"]["reason"].startswith("batch-timeout"), out
    assert "session_terminated" in events
    assert Session.objects.get(pk=session.pk).result == "failure"


TEMPLATE = f"""api_version: v1
kind: taskTemplate
metadata:
  name: cli-template
spec:
  session_type: interactive
  kernel:
    image: {IMAGE}
    environ:
      FROM_TEMPLATE: yes-it-is
    run:
      bootstrap: echo template-bootstrap
      startup_command: echo template-startup-$FROM_TEMPLATE
  resources:
    cpu: "1"
    mem: 128m
"""


def create_from_template(backendai, keypair, template_id, name):
    """`session create-from-template`, through its SDK function for 26.9.6, whose CLI
    passes the function an argument it does not take (TypeError: unexpected keyword
    argument 'attach_network', before any request)."""
    if backendai.release == "23.9.10":
        return backendai(keypair, "session", "create-from-template", "--name", name,
                         template_id)
    return backendai.python(keypair, (  # printing what the CLI prints for RUNNING
        "from ai.backend.client.session import Session\n"
        "with Session() as api:\n"
        f"    created = api.ComputeSession.create_from_template({template_id!r}, name={name!r})\n"
        "    print(f'Session ID {created.id} is created and ready.' "
        "if created.status == 'RUNNING' else created.status)\n"))


def test_a_session_template_round_trip(backendai, alice, bob, tmp_path):
    kp = main_keypair(alice)
    path = tmp_path / "template.yaml"
    path.write_text(TEMPLATE)
    code, out = backendai(kp, "session-template", "create", "-f", str(path))
    assert code == 0, out
    template_id = re.search(r"Task template (\S+) created and ready", out).group(1)
    assert SessionTemplate.objects.get(pk=template_id).user == alice

    code, out = backendai(kp, "session-template", "list")
    assert code == 0 and template_id in out and "cli-template" in out, out
    code, out = backendai(kp, "session-template", "get", template_id)
    assert code == 0 and "template-startup-$FROM_TEMPLATE" in out, out
    code, out = backendai(main_keypair(bob), "session-template", "get", template_id)
    assert code == 1 and "There is no session template" in out, out  # another user's

    path.write_text(TEMPLATE.replace("name: cli-template", "name: cli-template-2"))
    code, out = backendai(kp, "session-template", "update", template_id, "-f", str(path))
    assert code == 0 and "updated" in out, out
    assert SessionTemplate.objects.get(pk=template_id).name == "cli-template-2"

    code, out = create_from_template(backendai, kp, template_id, "tpl1")
    assert code == 0 and "is created and ready" in out, out
    session = session_named("tpl1")
    assert session.environ == {"FROM_TEMPLATE": "yes-it-is"}
    assert session.requested_slots == {"cpu": "1", "mem": str(128 * 2**20)}

    def logged():
        _, out = backendai(kp, "session", "logs", "tpl1")
        return "template-startup-yes-it-is" in out and out
    out = wait_for(logged, timeout=60, interval=1, message="the template's startup output")
    assert out.index("template-bootstrap") < out.index("template-startup-yes-it-is"), out

    code, out = backendai(kp, "session", "show-graph", "--table", "tpl1")
    assert code == 0 and str(session.pk) in out and "KernelStatus.RUNNING" in out, out

    code, out = backendai(kp, "rm", "tpl1")
    assert code == 0 and "Done." in out, out
    code, out = backendai(kp, "session-template", "delete", "-f", template_id)
    assert code == 0 and "deleted" in out, out
    assert not SessionTemplate.objects.filter(pk=template_id).exists()


def test_cli_errors_are_printed_from_backendai_json(backendai, alice):
    code, out = backendai(main_keypair(alice), "session", "logs", "no-such-session")
    assert code == 1
    assert "No such object." in out and "There is no session named 'no-such-session'." in out
