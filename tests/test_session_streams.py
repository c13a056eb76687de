"""The pure parts of the Backend.AI clients' streams and session files: the path rules of
the scratch directory, the tar framing of downloads, the protocol frames of streamed
execution and the terminal, and the refusals at the websocket handshake."""

import asyncio
import base64
import io
import json
import tarfile
import time
from datetime import UTC, datetime

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from agents_app.runtime import python_query
from agents_app.runtime.session_files import TAR_END, scratch_path, tar_header, tar_padding
from agents_app.runtime.session_streams import (
    START_MARKER,
    STARTED,
    ExecRun,
    PidReader,
    aggregate_console,
)
from backendai_web.asgi import application
from identity_app.api.authentication import sign
from identity_app.keypairs import main_keypair
from sessions_app.compat.streams import (
    execution_message,
    execution_request,
    pty_input,
    pty_output,
)
from sessions_app.enums import Status
from storage_app.files import FileError
from tests.factories import make_agent, make_session
from tests.signing import API_VERSION, signed_call


@pytest.mark.parametrize("given, expected", [
    ("data.txt", "data.txt"),
    ("sub/dir/data.txt", "sub/dir/data.txt"),
    ("/home/work/data.txt", "data.txt"),
    ("/home/work/sub/", "sub"),
    ("/home/work", ""),
    ("", ""),
])
def test_scratch_paths_are_relative_to_home_work(given, expected):
    assert scratch_path(given) == expected


@pytest.mark.parametrize("given", [
    "../data.txt", "sub/../../etc/passwd", "/etc/passwd", "/home/workshop/x", "/home/work/../x",
    "a\x00b", "a//b", "./a", None,
])
def test_scratch_paths_refuse_what_folders_refuse(given):
    with pytest.raises(FileError):
        scratch_path(given)


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 70000])
def test_a_streamed_tar_member_reads_back_with_tarfile(size):
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    archive = (tar_header("naïve name.bin", size, 0o100640, 1_700_000_000) + data
               + tar_padding(size) + TAR_END)
    assert len(archive) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        [member] = tar.getmembers()
        assert (member.name, member.size, member.mode, member.mtime) == (
            "naïve name.bin", size, 0o640, 1_700_000_000)
        assert tar.extractfile(member).read() == data
        assert tarfile.data_filter(member, "/tmp") is not None  # what 26.9.6 extracts with


def test_the_process_id_line_is_taken_off_stderr():
    reader = PidReader()
    assert reader.feed(b"12") == b""
    assert reader.feed(b"3\nfirst error\n") == b"first error\n"
    assert reader.pid == 123
    assert reader.feed(b"more") == b"more"


def test_stderr_without_a_process_id_is_passed_on():
    reader = PidReader()
    assert reader.feed(b"x" * 65) == b"x" * 65
    assert reader.pid == 0


def test_the_start_marker_after_the_process_id_is_taken_off_stderr():
    reader = PidReader()
    assert reader.feed(b"123\n" + START_MARKER[:5]) == b""
    assert reader.feed(START_MARKER[5:] + b"Traceback\n") == b"Traceback\n"
    assert (reader.pid, reader.started) == (123, True)
    assert reader.feed(START_MARKER) == START_MARKER  # later on: the command's own bytes
    assert python_query.START_MARKER == START_MARKER  # what the interpreter's client writes


def test_stderr_that_only_begins_like_the_marker_is_the_commands():
    reader = PidReader()
    assert reader.feed(b"7\n" + START_MARKER[:4]) == b""
    assert reader.feed(b"x") == START_MARKER[:4] + b"x"
    assert not reader.started
    ended = PidReader()
    assert ended.feed(b"7\n" + START_MARKER[:4]) == b""
    assert ended.rest() == START_MARKER[:4]  # the stream ended: what was held is passed on


def test_execution_messages_have_the_managers_shape():
    assert json.loads(execution_message("continued", [["stdout", "a\n"]])) == {
        "status": "continued", "console": [["stdout", "a\n"]], "exitCode": None,
        "options": None, "files": None}
    assert json.loads(execution_message("finished", exit_code=3))["exitCode"] == 3


def test_a_results_console_joins_each_run_of_one_stream_in_order():
    assert aggregate_console([("stdout", "a"), ("stdout", "b\n"), ("stderr", "e1"),
                              ("stderr", "e2"), ("stdout", "c")]) == [
        ["stdout", "ab\n"], ["stderr", "e1e2"], ["stdout", "c"]]
    assert aggregate_console([]) == []


class QueuedRun(ExecRun):
    """An ExecRun whose output is put in its queue by the test, not read from Docker."""

    def __init__(self, exit_code, marked=False):
        super().__init__(api=None, container_id="c", marked=marked)
        self.code = exit_code

    async def exit_code(self):
        return self.code


async def results_of(run, flush):
    results = []
    while not results or results[-1]["status"] != "finished":
        results.append(await run.next_result(flush))
    return results


@pytest.mark.asyncio
async def test_a_run_that_ends_within_the_interval_is_one_finished_result():
    run = QueuedRun(exit_code=3)
    for record in (("stdout", "first\n"), ("stderr", "oops\n"), ("stdout", "second\n")):
        await run.queue.put(record)
    await run.queue.put(None)
    assert await results_of(run, 0.2) == [{
        "status": "finished", "exitCode": 3,
        "console": [["stdout", "first\n"], ["stderr", "oops\n"], ["stdout", "second\n"]]}]


@pytest.mark.asyncio
async def test_a_long_run_is_continued_at_every_interval_with_what_came_meanwhile():
    run = QueuedRun(exit_code=0)

    async def program():
        await run.queue.put(("stdout", "a\n"))
        await asyncio.sleep(1.0)
        await run.queue.put(("stdout", "b\n"))
        await asyncio.sleep(0.05)
        await run.queue.put(None)

    started = time.monotonic()
    writer = asyncio.ensure_future(program())
    results = await results_of(run, 0.2)
    await writer
    assert results[0] == {"status": "continued", "console": [["stdout", "a\n"]],
                          "exitCode": None}
    assert len(results) >= 4  # one at least every 0.2 s of the second's wait
    assert all(r["status"] == "continued" for r in results[:-1])
    assert results[-1]["status"] == "finished" and results[-1]["exitCode"] == 0
    assert "".join(text for r in results for _, text in r["console"]) == "a\nb\n"
    assert time.monotonic() - started < 2.0


def test_the_first_frame_of_an_execution_names_its_mode():
    assert execution_request('{"code": "print(1)", "mode": "query", "options": {}}') == (
        "query", "print(1)", {})
    assert execution_request(json.dumps({"mode": "batch", "options": {"exec": "ls"}})) == (
        "batch", "", {"exec": "ls"})
    for bad in ("", "not json", "[]", '{"mode": "input"}', '{"mode": "query", "options": 1}'):
        with pytest.raises(ValueError):
            execution_request(bad)


def test_terminal_frames_both_ways():
    chars = base64.b64encode(b"ls\r").decode()
    assert pty_input(json.dumps({"type": "stdin", "chars": chars})) == ("stdin", b"ls\r")
    assert pty_input('{"type": "resize", "rows": 30, "cols": 100}') == ("resize", 100, 30)
    assert pty_input('{"type": "ping"}') == ("ping",)
    assert pty_input('{"type": "restart"}') == ("restart",)
    for bad in ('{"type": "stdin", "chars": "***"}', '{"type": "resize", "rows": "x"}',
                '{"type": "other"}', "[]", "nope", None):
        assert pty_input(bad) is None
    assert json.loads(pty_output(b"\x1b[1mhi")) == {
        "type": "out", "data": base64.b64encode(b"\x1b[1mhi").decode()}


def test_a_multipart_request_is_signed_without_its_boundary(client, alice_keypair):
    # The SDK signs "multipart/form-data" and aiohttp sends it with a boundary: the
    # signature holds (a 404 for the unknown session, not a 401).
    response = signed_call(client, alice_keypair, "POST", "/session/nosuch/upload",
                           content_type="multipart/form-data")
    assert response.status_code == 404, response.content
    response = client.post("/session/nosuch/upload", data=b"--b--",
                           content_type="multipart/form-data; boundary=b",
                           headers=_signature(alice_keypair, "POST", "/session/nosuch/upload",
                                              "multipart/form-data"))
    assert response.status_code == 404, response.content
    assert response.json()["title"] == "No such object."


def test_a_download_names_its_files(client, alice_keypair):
    response = signed_call(client, alice_keypair, "POST", "/session/nosuch/download", {})
    assert response.status_code == 400
    assert "files" in response.json()["msg"]


def _signature(keypair, method, path, content_type, host="testserver"):
    date = datetime.now(UTC).isoformat()
    signature = sign(keypair.secret_key, method=method, path=path, date=date, host=host,
                     content_type=content_type, version=API_VERSION)
    return {"Date": date, "X-BackendAI-Version": API_VERSION,
            "Authorization": f"BackendAI signMethod=HMAC-SHA256, "
                             f"credential={keypair.access_key}:{signature}"}


async def _handshake(path, headers=()):
    communicator = WebsocketCommunicator(application, path, headers=list(headers))
    connected, code = await communicator.connect(timeout=5)
    await communicator.disconnect()
    return connected


def _ws_headers(keypair, path):
    signed = _signature(keypair, "GET", path, "application/octet-stream", host="server")
    return [(b"host", b"server"), *((k.lower().encode(), v.encode()) for k, v in signed.items())]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_unsigned_and_foreign_stream_handshakes_are_refused(settings, alice, bob,
                                                                 monkeypatch):
    settings.ALLOWED_HOSTS = ["server", "testserver"]
    # Out of the live system's way, as in tests/test_websocket.py: this test commits, and a
    # manager worker or agent of a `live` test would otherwise schedule or reconcile its
    # container-less kernel under the test's own locks (a deadlock, seen once in CI).
    monkeypatch.setattr("scheduling_app.scheduler.kicks.kick", lambda group: None)
    agent = await database_sync_to_async(make_agent)(
        "streams-refusal-agent", group="streams-no-agents", schedulable=False)
    session = await database_sync_to_async(make_session)(
        user=alice, status=Status.RUNNING, agent=agent, scaling_group="streams-no-agents")
    path = f"/stream/session/{session.pk}/execute"
    assert not await _handshake(path)  # not signed
    bob_kp = await database_sync_to_async(main_keypair)(bob)
    assert not await _handshake(path, _ws_headers(bob_kp, path))  # another user's session
    assert not await _handshake("/stream/session/x/other", _ws_headers(bob_kp, "/x"))


@pytest.mark.asyncio
async def test_a_marked_runs_first_interval_counts_from_its_codes_start():
    run = QueuedRun(exit_code=0, marked=True)

    async def program():
        await asyncio.sleep(0.5)  # the interpreter takes the run (after another one, say)
        await run.queue.put(STARTED)
        await asyncio.sleep(0.1)
        await run.queue.put(("stdout", "2\n"))
        await run.queue.put(None)

    writer = asyncio.ensure_future(program())
    assert await results_of(run, 0.2) == [
        {"status": "finished", "console": [["stdout", "2\n"]], "exitCode": 0}]
    await writer
