"""What session events carry (Backend.AI's event fields): the API's event rows, the
Backend.AI routes' SSE; the websocket's messages are in test_websocket.py."""

import json

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from identity_app.keypairs import main_keypair
from sessions_app.enums import Status
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from tests.factories import make_session
from tests.signing import signed_call

S = Status
pytestmark = pytest.mark.usefixtures("sent")


def test_event_rows_carry_the_session_kernel_and_owner_through_their_joins(client, alice):
    session = make_session(alice, S.RUNNING, cluster_size=2)
    client.force_login(alice)
    client.delete(f"/api/v1/sessions/{session.pk}/")
    url = f"/api/v1/sessions/{session.pk}/events/"
    client.get(url)  # the first request of a session reads more (rate limit, keypair)
    with CaptureQueriesContext(connection) as few:
        client.get(url + "?limit=2")
    with CaptureQueriesContext(connection) as many:
        rows = client.get(url + "?limit=100").json()["results"]
    assert len(rows) >= 20 and len(many) == len(few)  # joined, not a query per row
    sub = next(r for r in rows if r["name"] == "kernel_terminating"
               and r["cluster_role"] == "sub")
    assert sub == {**sub, "session_id": str(session.pk), "session_name": "s1",
                   "kernel_id": str(session.kernels.get(cluster_role="sub").pk),
                   "cluster_idx": 1, "access_key": session.keypair_id,
                   "domain": "default", "project": "default", "user": "alice",
                   "reason": "user-requested"}
    requested = next(r for r in rows if r["name"] == "session_destroy_requested")
    assert (requested["kernel_id"], requested["cluster_role"], requested["cluster_idx"]) == (
        None, None, None)
    detail = client.get(f"/api/v1/sessions/{session.pk}/").json()["history"]
    assert detail == rows


def test_the_event_stream_carries_backendais_fields(client, alice):
    session = make_session(alice, S.RUNNING, name="s1")
    client.force_login(alice)
    client.delete(f"/api/v1/sessions/{session.pk}/")
    kernel = session.kernels.get()
    handle_kernel_event(kernel.pk, "kernel_terminated", {"exit_code": 0})
    response = signed_call(client, main_keypair(alice), "GET",
                           f"/events/session?sessionId={session.pk}")

    async def collect():
        return [chunk async for chunk in response.streaming_content]

    body = b"".join(async_to_sync(collect)()).decode()
    events = {}
    for block in body.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            events[lines["event"]] = json.loads(lines["data"])
    assert events["kernel_terminated"] == {
        "reason": "user-requested", "sessionName": "s1",
        "ownerAccessKey": session.keypair_id, "sessionId": str(session.pk), "exitCode": 0,
        "domainName": "default", "groupName": "default", "userName": "alice",
        "status": "TERMINATED", "at": events["kernel_terminated"]["at"],
        "kernelId": str(kernel.pk), "clusterRole": "main", "clusterIdx": 1}
    assert "clusterRole" not in events["session_terminated"]
    assert events["session_terminated"]["userName"] == "alice"
    assert events["session_destroy_requested"]["reason"] == "user-requested"
