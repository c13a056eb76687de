"""The web side of the stream proxy, without a browser: what the app gets and gives of
headers and cookies, and who is granted what (sessions_app/realtime)."""

import channels.consumer
import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from multidict import CIMultiDict

from agents_app import stream_tokens
from agents_app.models import Image
from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair
from sessions_app.compat import views as compat
from sessions_app.enums import Status
from sessions_app.realtime import access
from sessions_app.realtime.apps import app_request_headers, app_response_headers
from sessions_app.realtime.relay import RelayConsumer
from tests.factories import make_agent, make_session

S = Status


def test_the_app_gets_none_of_the_sites_cookies_nor_a_token_the_browser_sent():
    scope = {"headers": [
        (b"host", b"dash.example:8000"),
        (b"cookie", b"sessionid=secret; _xsrf=abc; csrftoken=t; other=1"),
        (b"x-stream-token", b"forged"), (b"connection", b"keep-alive"),
        (b"accept", b"text/html")], "client": ("10.0.0.9", 5555), "scheme": "http"}
    headers = dict(app_request_headers(scope))
    assert headers["cookie"] == "_xsrf=abc; other=1"
    assert "x-stream-token" not in {k.lower() for k in headers}
    assert "connection" not in headers and headers["accept"] == "text/html"
    assert headers["X-Forwarded-Host"] == "dash.example:8000"
    assert headers["X-Forwarded-For"] == "10.0.0.9"
    only_site = dict(app_request_headers({"headers": [(b"cookie", b"sessionid=s")]}))
    assert "cookie" not in only_site


def test_the_app_cannot_set_the_sites_cookies():
    answer = CIMultiDict([("Content-Type", "text/html"), ("Set-Cookie", "sessionid=x; Path=/"),
                          ("Set-Cookie", "_xsrf=1; Path=/sessions/"),
                          ("Transfer-Encoding", "chunked")])
    assert app_response_headers(answer) == [(b"Content-Type", b"text/html"),
                                            (b"Set-Cookie", b"_xsrf=1; Path=/sessions/")]


@pytest.mark.django_db
def test_grants_owner_and_admin_only_running_only_declared_services_only(alice, bob, carol):
    agent = make_agent(stream_addr="127.0.0.1:7000")
    Image.objects.filter(name="bai-local/busybox:latest").update(
        labels={stream_tokens.SERVICE_PORTS_LABEL: "jupyter:http:8888"})
    session = make_session(alice, S.RUNNING, agent=agent)
    grant = access.grant(alice, session.pk, "service:jupyter")
    payload = stream_tokens.verify(grant.token, agent_id=agent.pk, target="service:jupyter")
    kernel = session.kernels.get()
    assert (payload["k"], payload["c"]) == (str(kernel.pk), kernel.container_id)
    assert access.grant(carol, session.pk, "pty:t1").owner_id == alice.pk  # an admin
    with pytest.raises(access.Refusal) as refused:
        access.grant(bob, session.pk, "pty:t1")
    assert refused.value.status == 404
    with pytest.raises(access.Refusal) as refused:
        access.grant(alice, session.pk, "service:tensorboard")
    assert refused.value.status == 404
    with pytest.raises(access.Refusal) as refused:
        access.grant(alice, session.pk, "pty:../../x")
    assert refused.value.status == 404
    with pytest.raises(access.Refusal) as refused:
        access.grant(alice, "not-a-uuid", "pty:t1")
    assert refused.value.status == 404
    assert compat.service_ports_of(session) == [
        {"name": "jupyter", "protocol": "http", "container_ports": [8888],
         "host_ports": [None], "is_inference": False}]
    pending = make_session(alice, S.PENDING, name="s2")
    with pytest.raises(access.Refusal) as refused:
        access.grant(alice, pending.pk, "pty:t1")
    assert refused.value.status == 409


@pytest.mark.django_db
def test_a_grant_has_the_rights_of_the_acting_keypair(alice, bob):
    """Admin rights come with the keypair a user acts through, not with their main one:
    bob's admin keypair opens alice's terminal, his plain main keypair does not; and dave,
    whose main keypair is an admin's, acting through a plain one of his, does not either."""
    session = make_session(alice, S.RUNNING, agent=make_agent(stream_addr="127.0.0.1:7000"))
    policy = main_keypair(bob).resource_policy
    admin_key = KeyPair.objects.create(user=bob, is_admin=True, resource_policy=policy)
    assert access.grant(bob, session.pk, "pty:t1", admin_key).owner_id == alice.pk
    with pytest.raises(access.Refusal) as refused:
        access.grant(bob, session.pk, "pty:t1")
    assert refused.value.status == 404
    dave = User.objects.create_user("dave")
    KeyPair.objects.filter(user=dave, is_main=True).update(is_admin=True)
    assert access.grant(dave, session.pk, "pty:t1").owner_id == alice.pk
    plain_key = KeyPair.objects.create(user=dave, resource_policy=policy)
    with pytest.raises(access.Refusal) as refused:
        access.grant(dave, session.pk, "pty:t1", plain_key)
    assert refused.value.status == 404


@pytest.mark.asyncio
async def test_relayed_frames_skip_channels_database_hop(monkeypatch):
    """A terminal's keystrokes go straight to the relay: Channels' per-message
    close_old_connections (a hop to its one database thread) stays at connect and close."""
    hops, received = [], []

    async def counted():
        hops.append(1)

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)

    class Echo(RelayConsumer):
        async def receive(self, text_data=None, bytes_data=None):
            received.append(text_data)
            await self.send(text_data=text_data.upper())

    communicator = WebsocketCommunicator(Echo.as_asgi(), "/relay/")
    assert (await communicator.connect())[0]
    for key in "abcde":
        await communicator.send_to(text_data=key)
        assert await communicator.receive_from() == key.upper()
    await communicator.disconnect()
    assert received == list("abcde")
    assert len(hops) == 2  # websocket.connect and websocket.disconnect
