"""The Backend.AI clients' streams and session files against the running system (the web
process, a manager worker, an agent on Docker), with each client release (see `backendai`):
`backend.ai run` streaming its output from an existing session, the terminal through the
SDK's stream_pty, `session upload` / `session download` of the scratch directory, and what
is refused: bad paths, links out of it, another user's session."""

import json
import os
import time
from pathlib import Path

import pytest

from bench.common import PeakMemory
from identity_app.keypairs import main_keypair
from sessions_app.enums import Status
from sessions_app.models import Session

pytestmark = pytest.mark.docker
SDK_SCRIPT = Path(__file__).with_name("sdk_streams.py")


@pytest.fixture
def python_session(backendai, alice, jupyter_image):
    """A RUNNING session of alice's on the image with Python, named after the client."""
    name = "streams-" + backendai.release.replace(".", "-")
    code, out = backendai(main_keypair(alice), "create", "--name", name, "-r", "cpu=1",
                          "-r", "mem=512m", jupyter_image, timeout=300)
    assert code == 0, out
    session = Session.objects.filter(name=name).order_by("-created_at").first()
    assert session.status == Status.RUNNING
    return session


def sdk(backendai, backendai_cli, keypair, *args, timeout=120):
    """(exit code, the JSON lines) of sdk_streams.py under the client's own Python."""
    done = backendai.script(keypair, SDK_SCRIPT, *args, timeout=timeout)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, lines, done.stdout + done.stderr


def in_container(docker_client, session, command):
    container = docker_client.containers.get(session.kernels.get().container_id)
    result = container.exec_run(["/bin/sh", "-c", command])
    return result.exit_code, result.output.decode()


CODE = ("import sys, time\n"
        "print('first', flush=True)\n"
        "time.sleep(2)\n"
        "print('second')\n"
        "sys.stderr.write('to-stderr\\n')\n"
        "sys.exit(3)\n")


def test_run_streams_the_output_of_code_in_an_existing_session(backendai, alice, tmp_path,
                                                               python_session, jupyter_image):
    kp = main_keypair(alice)
    code, out = backendai(kp, "run", "--name", python_session.name, "-c", CODE, jupyter_image)
    assert f"Reusing session {python_session.name}" in out, out
    assert "first\n" in out and "second\n" in out and "to-stderr" in out, out
    assert "Execution finished. (exit code = 3)" in out, out
    assert code == 0, out  # the CLI reports the program's exit code, as it does for Backend.AI

    # With files: uploaded into /home/work, then run there in batch mode.
    (tmp_path / "main.py").write_text("print(open('input.txt').read().upper())\n")
    (tmp_path / "input.txt").write_text("from a file")
    code, out = backendai(kp, "run", "--name", python_session.name, "--exec",
                          "python3 main.py", jupyter_image, "main.py", "input.txt",
                          cwd=tmp_path)
    assert code == 0 and "Uploading done." in out, out
    assert "FROM A FILE" in out and "Execution finished. (exit code = 0)" in out, out


def test_the_sdks_stream_execute_sends_output_as_it_is_written(backendai, backendai_cli, alice,
                                                               python_session, docker_client):
    code, messages, out = sdk(backendai, backendai_cli, main_keypair(alice), "execute",
                              python_session.name, CODE)
    assert code == 0, out
    assert [m["status"] for m in messages][-1] == "finished", out
    assert messages[-1]["exitCode"] == 3
    first = next(m for m in messages if ["stdout", "first\n"] in m["console"])
    # Streamed: "first" came while the program still slept, not with its end.
    assert messages[-1]["t"] - first["t"] >= 1.5, messages
    stderr = "".join(text for m in messages for stream, text in m["console"]
                     if stream == "stderr")
    assert stderr.startswith("to-stderr\n") and stderr.endswith("SystemExit: 3\n"), stderr
    assert ["stdout", "second\n"] in [record for m in messages for record in m["console"]]

    # A client that goes away ends its command.
    late = "import time\nprint('started', flush=True)\ntime.sleep(4)\nopen('late.txt', 'w')\n"
    code, messages, out = sdk(backendai, backendai_cli, main_keypair(alice), "leave",
                              python_session.name, late)
    assert code == 0 and messages[0]["console"] == [["stdout", "started\n"]], out
    time.sleep(6)
    assert in_container(docker_client, python_session, "ls /home/work/late.txt")[0] != 0


def console_text(messages, stream):
    return "".join(text for m in messages for name, text in m["console"] if name == stream)


def test_a_short_program_is_answered_with_one_finished_message(backendai, backendai_cli,
                                                               alice, python_session):
    kp = main_keypair(alice)
    for action in ("execute", "rest"):  # stream_execute, then execute
        code, messages, out = sdk(backendai, backendai_cli, kp, action, python_session.name,
                                  "print('hello')\nprint('oops', file=__import__('sys').stderr)")
        assert code == 0, out
        assert [(m["status"], m["exitCode"]) for m in messages] == [("finished", 0)], out
        # stdout and stderr are two pipes: which of the two came first is not kept.
        assert sorted(map(tuple, messages[0]["console"])) == [("stderr", "oops\n"),
                                                              ("stdout", "hello\n")], out


def test_a_long_program_is_continued_at_the_flush_interval(backendai, backendai_cli, alice,
                                                           python_session):
    kp = main_keypair(alice)
    long = "import time\nprint('before', flush=True)\ntime.sleep(3)\nprint('after')"
    code, messages, out = sdk(backendai, backendai_cli, kp, "execute", python_session.name,
                              long)
    assert code == 0, out
    # Every 0.2 s a message with what came meanwhile (mostly nothing), then the end.
    assert [m["status"] for m in messages[:-1]] == ["continued"] * (len(messages) - 1)
    assert messages[-1]["status"] == "finished" and messages[-1]["exitCode"] == 0
    assert len(messages) >= 10, out
    assert messages[0]["console"] == [["stdout", "before\n"]], out
    assert console_text(messages, "stdout") == "before\nafter\n"

    code, results, out = sdk(backendai, backendai_cli, kp, "rest", python_session.name, long)
    assert code == 0, out
    # execute answers after 2 s with what came, and each `continue` the next 2 s.
    assert results[0]["status"] == "continued" and 1.5 <= results[0]["t"] < 3.0, out
    assert results[0]["console"] == [["stdout", "before\n"]]
    assert results[-1]["status"] == "finished" and results[-1]["exitCode"] == 0
    assert len({r["runId"] for r in results}) == 1 and len(results) >= 2
    assert console_text(results, "stdout") == "before\nafter\n"


def test_query_mode_runs_in_one_python_interpreter_per_kernel(backendai, backendai_cli, alice,
                                                              python_session):
    kp = main_keypair(alice)
    code, results, out = sdk(backendai, backendai_cli, kp, "rest", python_session.name,
                             "x = 1", "print(x)", "x + 1", "import sys; sys.exit(2)")
    assert code == 0, out
    assert [(r["call"], r["console"], r["exitCode"]) for r in results[:3]] == [
        (0, [], 0), (1, [["stdout", "1\n"]], 0), (2, [["stdout", "2\n"]], 0)], out
    assert results[3]["exitCode"] == 2
    traceback = console_text(results[3:], "stderr")
    assert traceback.startswith("Traceback (most recent call last):") and \
        traceback.endswith("SystemExit: 2\n"), traceback
    # The streamed runs reach the same interpreter; an exception is exit code 1.
    code, messages, out = sdk(backendai, backendai_cli, kp, "execute", python_session.name,
                              "x * 21")
    assert code == 0 and console_text(messages, "stdout") == "21\n", out
    code, messages, out = sdk(backendai, backendai_cli, kp, "execute", python_session.name,
                              "1 / 0")
    assert messages[-1]["exitCode"] == 1
    assert console_text(messages, "stderr").endswith("ZeroDivisionError: division by zero\n")


def test_the_terminal_runs_what_is_typed_at_the_size_asked(backendai, backendai_cli, alice,
                                                           python_session):
    code, lines, out = sdk(backendai, backendai_cli, main_keypair(alice), "pty",
                           python_session.name)
    assert code == 0, out
    assert "pty-42" in lines[0]["output"] and "30 100" in lines[0]["output"], out
    assert "again-5" in lines[1]["output"], out  # after a restart, in a new shell


def test_files_go_up_and_come_back_byte_for_byte(backendai, alice, python_session, tmp_path,
                                                 docker_client):
    kp = main_keypair(alice)
    source = tmp_path / "up"
    (source / "sub").mkdir(parents=True)
    payload = os.urandom(3 * 1024 * 1024 + 17)
    (source / "data.bin").write_bytes(payload)
    (source / "sub" / "note.txt").write_text("a note\n")
    code, out = backendai(kp, "session", "upload", python_session.name, "data.bin",
                          "sub/note.txt", cwd=source)
    assert code == 0 and "Uploaded." in out, out
    # The kernel sees them in its working directory.
    assert in_container(docker_client, python_session, "cat /home/work/sub/note.txt") == (
        0, "a note\n")

    dest = tmp_path / "down"
    dest.mkdir()
    code, out = backendai(kp, "session", "download", python_session.name, "data.bin",
                          "/home/work/sub/note.txt", "--dest", str(dest))
    assert code == 0 and "Downloaded to" in out, out
    assert (dest / "data.bin").read_bytes() == payload
    assert (dest / "note.txt").read_text() == "a note\n"


def test_a_large_file_passes_without_the_web_process_or_agent_holding_it(
        backendai, alice, python_session, tmp_path, web_server, live, docker_client):
    assert in_container(docker_client, python_session,
                        "head -c 104857600 /dev/urandom > /home/work/big.bin")[0] == 0
    kp = main_keypair(alice)
    pids = {"web": web_server.popen.pid, "agent": live.agent.popen.pid}
    # The download first: the upload's memory, once taken, would hide the download's.
    with PeakMemory(**pids) as download:
        code, out = backendai(kp, "session", "download", python_session.name, "big.bin",
                              "--dest", str(tmp_path), timeout=600)
        assert code == 0, out
    (tmp_path / "up").mkdir()
    (tmp_path / "big.bin").rename(tmp_path / "up" / "back.bin")
    with PeakMemory(**pids) as upload:
        code, out = backendai(kp, "session", "upload", python_session.name, "back.bin",
                              cwd=tmp_path / "up", timeout=600)
        assert code == 0, out
    assert in_container(docker_client, python_session,
                        "cmp /home/work/big.bin /home/work/back.bin && echo same")[1] == "same\n"
    print(f"peak RSS growth, 100 MiB download: {download.growth()}, upload: {upload.growth()}")
    # Each holds a few chunks of 1 MiB at a time, never the 100 MiB file (under daphne,
    # which read a whole request body before the application, the web process grew by
    # 1.3 GB during this upload).
    limit = 40 * 1024 * 1024
    assert max(download.growth().values()) < limit, download.growth()
    assert max(upload.growth().values()) < limit, upload.growth()


def test_bad_paths_and_links_out_of_the_scratch_directory_are_refused(
        backendai, backendai_cli, alice, python_session, tmp_path, docker_client):
    kp = main_keypair(alice)
    assert in_container(docker_client, python_session,
                        "ln -s /etc/passwd /home/work/pw && ln -s /tmp /home/work/tmp-link "
                        "&& echo secret > /tmp/outside")[0] == 0
    for path, message in (("../etc/passwd", "may not contain '..'"),
                          ("/etc/passwd", "not absolute"),
                          ("pw", "is or passes through a symbolic link"),
                          ("tmp-link/outside", "symbolic link"),
                          ("missing.txt", "There is no 'missing.txt'")):
        code, out = backendai(kp, "session", "download", python_session.name, path,
                              "--dest", str(tmp_path))
        assert code == 1 and message in out, (path, out)
    assert not (tmp_path / "passwd").exists() and not (tmp_path / "outside").exists()

    # An upload through a link the kernel made is refused; nothing lands outside.
    source = tmp_path / "up" / "tmp-link"
    source.mkdir(parents=True)
    (source / "planted").write_text("x")
    code, out = backendai(kp, "session", "upload", python_session.name, "tmp-link/planted",
                          cwd=source.parent)
    assert code == 1 and "symbolic link" in out, out
    for name, message in (("../evil", "may not contain '..'"), ("/etc/evil", "not absolute")):
        code, lines, out = sdk(backendai, backendai_cli, kp, "upload-as",
                               python_session.name, name)
        assert code == 3 and lines[0]["status"] == 400, out
        assert message in json.dumps(lines[0]["data"]), out
    assert in_container(docker_client, python_session,
                        "ls /tmp/planted /etc/evil /home/evil 2>&1; true")[1].count(
                            "No such file") == 3


def test_another_users_session_is_refused_on_every_route(backendai, backendai_cli, alice, bob,
                                                         python_session, tmp_path):
    kp = main_keypair(bob)
    ref = str(python_session.pk)
    code, out = backendai(kp, "session", "download", ref, "x", "--dest", str(tmp_path))
    assert code == 1 and "No such object." in out, out
    (tmp_path / "f.txt").write_text("x")
    code, out = backendai(kp, "session", "upload", ref, "f.txt", cwd=tmp_path)
    assert code == 1 and "No such object." in out, out
    for action in ("execute", "pty"):
        args = (action, ref, "print(1)") if action == "execute" else (action, ref)
        code, lines, out = sdk(backendai, backendai_cli, kp, *args)
        assert code == 3 and "403" in lines[0]["refused"], out

