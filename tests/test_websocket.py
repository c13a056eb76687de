"""/ws/events/ through the project's ASGI application and the real Redis channel layer."""

import datetime

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client
from django.utils import timezone

from agents_app.models import Agent, Image
from backendai_web import metrics
from backendai_web.asgi import application
from backendai_web.metrics_view import exposition
from identity_app.keypairs import main_keypair
from scheduling_app.models import ScalingGroup
from sessions_app import events
from sessions_app.enums import Status
from sessions_app.lifecycle import destroy_session
from sessions_app.models import Session, SessionEvent
from sessions_app.realtime.consumers import CATCH_UP_OVERLAP
from tests.factories import make_agent, make_session
from tests.support import IMAGE

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
S = Status
MESSAGE_KEYS = {"id", "event", "session_id", "session_name", "kernel_id", "cluster_role",
                "cluster_idx", "access_key", "domain_id", "project_id", "user_id", "status",
                "previous_status", "reason", "at", "data"}


def cookie_of(user):
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


@pytest.fixture
def login(redis_available, alice, bob, carol):
    """Session cookies by user, made before the test's event loop runs."""
    cookies = {user.pk: cookie_of(user) for user in (alice, bob, carol)}
    return lambda user: cookies[user.pk]


@pytest.fixture(autouse=True)
def out_of_the_live_schedulers_way(defaults, monkeypatch):
    """No scheduler pass for the tests' sessions, which could not be placed anyway.

    These tests commit (transaction=True): a manager worker still running from a `live`
    test would otherwise schedule (or, with the image not registered yet, cancel) their
    PENDING sessions and add events of its own.
    """
    monkeypatch.setattr("scheduling_app.scheduler.kicks.kick", lambda group_name: None)
    ScalingGroup.objects.create(name="no-agents")
    Image.objects.get_or_create(name=IMAGE)
    make_agent("ws-agent", schedulable=False)


@pytest_asyncio.fixture(autouse=True)
async def close_worker_thread_connections():
    """database_sync_to_async runs in a worker thread whose connection outlives the test
    (CONN_MAX_AGE); left open, PostgreSQL refuses to drop the test database at the end."""
    yield
    await database_sync_to_async(connections.close_all)()


async def new_session(user, status=S.PENDING, name="s1"):
    """The session, its events published: the publisher thread sends them after the
    commits, and one sent after a page subscribed would reach that page (CI saw a page's
    first message be such an event, not the samples it waited for)."""
    agent = await database_sync_to_async(lambda: Agent.objects.get(pk="ws-agent"))()
    session = await database_sync_to_async(make_session)(user, status, name=name, agent=agent,
                                                         scaling_group="no-agents")
    await sync_to_async(events.flush)()
    return session


async def connect(cookie=None, path="/ws/events/", origin="http://testserver"):
    headers = [(b"origin", origin.encode())]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


async def receive_all(communicator, timeout=0.5):
    """Every message until none comes for `timeout` seconds."""
    messages = []
    while not await communicator.receive_nothing(timeout=timeout):
        messages.append(await communicator.receive_json_from())
    return messages


async def test_an_unauthenticated_connection_is_closed(redis_available):
    communicator, connected, code = await connect()
    assert not connected and code == 4401


async def test_a_connection_from_another_origin_is_refused(alice, login):
    communicator, connected, _ = await connect(login(alice), origin="http://evil.example")
    assert not connected


async def test_a_user_receives_their_sessions_events_in_the_documented_form(alice, login):
    communicator, connected, _ = await connect(login(alice))
    assert connected
    session = await new_session(alice, S.SCHEDULED)
    first, second, third = [await communicator.receive_json_from(timeout=5) for _ in range(3)]
    assert set(first) == MESSAGE_KEYS
    assert first == {
        "id": first["id"], "event": "session_enqueued", "session_id": str(session.pk),
        "session_name": "s1", "kernel_id": None, "cluster_role": None, "cluster_idx": None,
        "access_key": session.keypair_id, "domain_id": session.domain_id,
        "project_id": session.project_id, "user_id": alice.pk, "status": "PENDING",
        "previous_status": "", "reason": "", "at": session.created_at.isoformat(), "data": {},
    }
    kernel = await database_sync_to_async(session.kernels.get)()
    assert (second["event"], second["kernel_id"], second["previous_status"],
            second["status"]) == ("kernel_scheduled", str(kernel.pk), "PENDING", "SCHEDULED")
    assert (second["cluster_role"], second["cluster_idx"], second["access_key"]) == (
        "main", 1, session.keypair_id)
    assert (third["event"], third["status"]) == ("session_scheduled", "SCHEDULED")
    ids = await database_sync_to_async(
        lambda: list(SessionEvent.objects.filter(session=session).values_list("pk", flat=True))
    )()
    assert [first["id"], second["id"], third["id"]] == ids
    await communicator.disconnect()


async def test_users_do_not_see_each_others_events(alice, bob, login):
    alices, _, _ = await connect(login(alice))
    bobs, _, _ = await connect(login(bob))
    await new_session(alice, name="alices")
    await new_session(bob, name="bobs")
    assert {m["session_name"] for m in await receive_all(alices)} == {"alices"}
    assert {m["session_name"] for m in await receive_all(bobs)} == {"bobs"}
    await alices.disconnect()
    await bobs.disconnect()


async def test_admins_receive_every_users_events_unless_they_ask_for_their_own(
        alice, bob, carol, login):
    everything, _, _ = await connect(login(carol))
    mine, _, _ = await connect(login(carol), path="/ws/events/?scope=mine")
    for user, name in ((alice, "alices"), (bob, "bobs"), (carol, "carols")):
        await new_session(user, name=name)
    assert {m["session_name"] for m in await receive_all(everything)} == {
        "alices", "bobs", "carols"}
    assert {m["session_name"] for m in await receive_all(mine)} == {"carols"}
    await everything.disconnect()
    await mine.disconnect()


async def test_a_user_with_an_admin_keypair_is_an_admin(alice, bob, login):
    def promote():
        keypair = main_keypair(bob)
        keypair.is_admin = True
        keypair.save()
    await database_sync_to_async(promote)()
    communicator, _, _ = await connect(login(bob))
    await new_session(alice)
    assert [m["event"] for m in await receive_all(communicator)] == ["session_enqueued"]
    await communicator.disconnect()


async def test_a_client_narrows_to_one_session(alice, bob, login):
    one = await new_session(alice, name="one")
    bobs = await new_session(bob, name="bobs")
    communicator, _, _ = await connect(login(alice), path=f"/ws/events/?session={one.pk}")
    assert await communicator.receive_json_from() == {"event": "subscribed",
                                                      "session_id": str(one.pk)}
    # following a session is not activity on it (idle culling)
    last = await database_sync_to_async(
        lambda: Session.objects.get(pk=one.pk).last_activity)()
    assert last is None
    await new_session(alice, name="two")
    await database_sync_to_async(cancel)(one)
    assert {m["session_name"] for m in await receive_all(communicator)} == {"one"}

    await communicator.send_json_to({"session": str(bobs.pk)})
    assert await communicator.receive_json_from() == {"event": "error",
                                                      "reason": "Session not found."}
    await communicator.send_json_to({"session": "not-a-uuid"})
    assert (await communicator.receive_json_from())["reason"] == "Session not found."
    await communicator.disconnect()


def cancel(session):
    destroy_session(session)


async def test_a_reconnecting_client_catches_up_on_what_it_missed(alice, bob, login):
    before = timezone.now()
    session = await new_session(alice, S.RUNNING)
    await new_session(bob, S.RUNNING, name="bobs")
    communicator, _, _ = await connect(login(alice))
    await communicator.send_json_to({"since": before.isoformat()})
    replayed = await receive_all(communicator)
    assert replayed[-1]["event"] == "caught_up"
    history = await database_sync_to_async(lambda: list(
        SessionEvent.objects.filter(session=session).order_by("created_at", "id")))()
    assert [m["id"] for m in replayed[:-1]] == [e.pk for e in history]
    assert [m["status"] for m in replayed[:-1] if m["event"].startswith("session_")] == [
        "PENDING", "SCHEDULED", "PREPARING", "PREPARED", "CREATING", "RUNNING"]
    assert all(set(m) == MESSAGE_KEYS for m in replayed[:-1])

    # Events older than `since` (less the overlap) are not replayed again.
    later = timezone.now() + CATCH_UP_OVERLAP + datetime.timedelta(minutes=1)
    await communicator.send_json_to({"since": later.isoformat()})
    assert [m["event"] for m in await receive_all(communicator)] == ["caught_up"]
    await communicator.disconnect()


async def test_a_narrowed_catch_up_replays_only_that_session(alice, login):
    before = timezone.now()
    one = await new_session(alice, name="one")
    await new_session(alice, name="two")
    communicator, _, _ = await connect(login(alice), path=f"/ws/events/?session={one.pk}")
    await communicator.receive_json_from()  # subscribed
    await communicator.send_json_to({"since": before.isoformat()})
    replayed = await receive_all(communicator)
    assert [m.get("session_name") for m in replayed] == ["one", None]
    await communicator.disconnect()


async def test_bad_requests_are_answered_with_an_error(alice, login):
    communicator, _, _ = await connect(login(alice))
    await communicator.send_json_to({"since": "yesterday"})
    assert (await communicator.receive_json_from())["reason"] == (
        "since must be an ISO 8601 time with a time zone.")
    await communicator.send_json_to({"hello": 1})
    assert (await communicator.receive_json_from())["event"] == "error"
    await communicator.disconnect()


async def test_a_list_page_can_leave_out_kernel_events(alice, login):
    before = timezone.now()
    communicator, _, _ = await connect(login(alice), path="/ws/events/?events=session")
    await new_session(alice, S.SCHEDULED)
    live = await receive_all(communicator)
    assert [m["event"] for m in live] == ["session_enqueued", "session_scheduled"]
    await communicator.send_json_to({"since": before.isoformat()})
    replayed = await receive_all(communicator)
    assert [m["event"] for m in replayed] == ["session_enqueued", "session_scheduled",
                                              "caught_up"]
    await communicator.disconnect()


async def test_open_websockets_are_counted_for_metrics(login, alice):
    await database_sync_to_async(metrics.reset)()

    def gauge():
        text = exposition().decode()
        return next(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith("backendai_websocket_connections "))

    first, connected, _ = await connect(cookie=login(alice))
    second, connected_too, _ = await connect(cookie=login(alice))
    assert connected and connected_too
    assert await database_sync_to_async(gauge)() == 2
    await first.disconnect()
    assert await database_sync_to_async(gauge)() == 1
    await second.disconnect()
    assert await database_sync_to_async(gauge)() == 0
    refused, accepted, code = await connect()  # no login: closed before it is counted
    assert not accepted and code == 4401
    assert await database_sync_to_async(gauge)() == 0


def heartbeat_with_samples(kernels, taken_at):
    from sessions_app.lifecycle.heartbeats import handle_heartbeat

    return handle_heartbeat({
        "id": "ws-agent", "scaling_group": "default", "images": [], "taken_at": taken_at,
        "kernels": [{"kernel_id": str(k.pk), "container_id": k.container_id,
                     "state": "running", "stat": {"at": taken_at - 0.2, "cpu_percent": 12.5,
                                                  "mem_bytes": 2048, "net_rx": 7}}
                    for k in kernels]})


async def test_a_page_following_a_session_gets_its_kernels_samples_and_no_others(
        alice, bob, login):
    mine = await new_session(alice, S.RUNNING, name="mine")
    bobs = await new_session(bob, S.RUNNING, name="bobs")
    kernels = await database_sync_to_async(
        lambda: list(mine.kernels.all()) + list(bobs.kernels.all()))()
    following, _, _ = await connect(login(alice), path=f"/ws/events/?session={mine.pk}")
    await following.receive_json_from()  # subscribed
    listing, _, _ = await connect(login(alice))  # a list page: no samples
    at = timezone.now().timestamp()
    await database_sync_to_async(heartbeat_with_samples)(kernels, at)
    message = await following.receive_json_from(timeout=5)
    assert message == {"event": "kernel_stat", "session_id": str(mine.pk), "reported_at": at,
                       "points": [{"kernel_id": str(kernels[0].pk), "t": round(at - 0.2, 3),
                                   "cpu": 12.5, "mem": 2048, "device": None,
                                   "cpu_seconds": None, "net_rx": 7, "net_tx": None,
                                   "blk_read": None, "blk_write": None}]}
    assert await receive_all(following) == []  # not bob's
    assert [m["event"] for m in await receive_all(listing)] == []
    await following.disconnect()
    await listing.disconnect()


async def test_a_batch_of_heartbeats_gives_each_page_its_sessions_samples_as_its_agent_sent_them(
        alice, login):
    """Heartbeats handled as one batch publish their samples in one message; each page
    still gets its own session's points and the time its own agent sent them."""
    from sessions_app.lifecycle.heartbeats import handle_heartbeats

    first = await new_session(alice, S.RUNNING, name="first")
    second = await new_session(alice, S.RUNNING, name="second")

    def move_second():
        make_agent("ws-agent-2", group="no-agents")
        second.kernels.update(agent_id="ws-agent-2")
        return list(first.kernels.all()), list(second.kernels.all())

    kernels_of_first, kernels_of_second = await database_sync_to_async(move_second)()
    pages = []
    for session in (first, second):
        page, _, _ = await connect(login(alice), path=f"/ws/events/?session={session.pk}")
        await page.receive_json_from()  # subscribed
        pages.append(page)
    at = timezone.now().timestamp()

    def beat(agent_id, kernels, taken_at):
        return {"id": agent_id, "scaling_group": "no-agents", "images": [],
                "taken_at": taken_at,
                "kernels": [{"kernel_id": str(k.pk), "container_id": k.container_id,
                             "state": "running", "stat": {"at": taken_at, "cpu_percent": 1.0}}
                            for k in kernels]}

    await database_sync_to_async(handle_heartbeats)([
        beat("ws-agent", kernels_of_first, at - 1), beat("ws-agent-2", kernels_of_second, at)])
    for page, kernels, sent in ((pages[0], kernels_of_first, at - 1),
                                (pages[1], kernels_of_second, at)):
        message = await page.receive_json_from(timeout=5)
        assert message["reported_at"] == sent
        assert [p["kernel_id"] for p in message["points"]] == [str(kernels[0].pk)]
        assert await receive_all(page) == []
        await page.disconnect()
