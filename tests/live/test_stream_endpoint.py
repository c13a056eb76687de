"""The agent's stream endpoint (agents_app/runtime/streams.py) against real containers:
tokens good, expired, forged, altered, for another agent or thing; a terminal (a TTY via
docker exec) with resize, resume and close; HTTP and websockets to a service port."""

import asyncio
import json
import re
import time
import uuid

import aiohttp
import pytest

from agents_app import stream_tokens
from agents_app.runtime import docker_backend as backend
from agents_app.runtime import services
from agents_app.runtime.agent import Agent
from agents_app.runtime.streams import StreamServer
from agents_app.stream_tokens import TOKEN_HEADER
from tests.support import IMAGE, stale_epoll_registrations, wait_for

pytestmark = pytest.mark.docker

# busybox's httpd serves /www; its CGI answers what it was asked (for the header and body
# tests) and a websocket is not something it speaks (the websocket test uses Python's).
HTTPD = ("mkdir -p /www/cgi-bin && echo hello-from-the-app > /www/index.html && "
         "head -c 3000000 /dev/zero > /www/big && "
         "printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\necho \"$REQUEST_METHOD "
         "$REQUEST_URI cookie=$HTTP_COOKIE\"\\ncat\\n' > /www/cgi-bin/echo && "
         "chmod +x /www/cgi-bin/echo && exec httpd -f -p 8080 -h /www")


@pytest.fixture(scope="module")
def agent_and_server(docker_client):
    agent = Agent(f"stream-test-{uuid.uuid4().hex[:6]}", "default")
    server = StreamServer(agent, "127.0.0.1:0").start()
    yield agent, server
    for container in docker_client.containers.list(ignore_removed=True,
            all=True, filters={"label": f"{backend.AGENT_ID}={agent.id}"}):
        container.remove(force=True)


@pytest.fixture(scope="module")
def kernel(agent_and_server, docker_client):
    agent, _ = agent_and_server
    kernel_id = str(uuid.uuid4())
    container = docker_client.containers.run(
        IMAGE, ["/bin/sh", "-c", HTTPD], detach=True,
        labels={backend.AGENT_ID: agent.id, backend.KERNEL_ID: kernel_id,
                stream_tokens.SERVICE_PORTS_LABEL: "web:http:8080,raw:tcp:9000"})
    # The app is up once its httpd answers inside the container (the tests are about the
    # endpoint, not about how fast busybox starts; seen: a first request answered 502).
    wait_for(lambda: container.exec_run(
        ["wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/index.html"]).exit_code == 0,
        timeout=30, message="the app's httpd to answer")
    container.reload()
    return kernel_id, container


def token(agent, kernel, target, **extra):
    kernel_id, container = kernel
    return stream_tokens.mint(agent_id=extra.pop("agent_id", agent.id), kernel_id=kernel_id,
                              container_id=container.id, target=target, **extra)


def run(coroutine):
    return asyncio.run(coroutine)


async def get(server, path, token_value, **kwargs):
    async with aiohttp.ClientSession() as http, http.get(
            f"http://{server.address}{path}", headers={TOKEN_HEADER: token_value},
            **kwargs) as response:
        return response.status, await response.read(), response.headers


# Tokens, pure.

def test_a_token_verifies_and_names_what_it_opens(settings):
    value = stream_tokens.mint(agent_id="a1", kernel_id="k", container_id="c",
                               target="pty:t1")
    assert stream_tokens.verify(value, agent_id="a1")["t"] == "pty:t1"
    with pytest.raises(stream_tokens.InvalidToken, match="another agent"):
        stream_tokens.verify(value, agent_id="a2")
    with pytest.raises(stream_tokens.InvalidToken, match="something else"):
        stream_tokens.verify(value, target="service:jupyter")


def test_an_expired_altered_or_forged_token_is_refused(settings):
    expired = stream_tokens.mint(agent_id="a", kernel_id="k", container_id="c", target="pty:t",
                                 ttl=5, now=time.time() - 10)
    with pytest.raises(stream_tokens.InvalidToken, match="expired"):
        stream_tokens.verify(expired)
    good = stream_tokens.mint(agent_id="a", kernel_id="k", container_id="c", target="pty:t")
    altered = good.replace(good.split(":")[0], good.split(":")[0][:-2] + "xx")
    with pytest.raises(stream_tokens.InvalidToken, match="signature"):
        stream_tokens.verify(altered)
    settings.STREAM_TOKEN_SECRET = "another manager's secret"
    with pytest.raises(stream_tokens.InvalidToken, match="signature"):
        stream_tokens.verify(good)


def test_service_ports_are_read_from_the_label():
    labels = {stream_tokens.SERVICE_PORTS_LABEL:
              "jupyter:http:8888, tb:preopen:6006,ssh:tcp:22,bad:udp:1,x:http:99999,junk"}
    assert [(s.name, s.protocol, s.port) for s in stream_tokens.service_ports(labels)] == [
        ("jupyter", "http", 8888), ("tb", "preopen", 6006), ("ssh", "tcp", 22)]
    assert stream_tokens.service_port({}, "jupyter") is None


# The endpoint, live.

def test_endpoint_refuses_missing_forged_expired_and_foreign_tokens(agent_and_server, kernel):
    agent, server = agent_and_server
    good = token(agent, kernel, "service:web")
    assert run(get(server, "/v1/app/index.html", good))[0] == 200
    forged = stream_tokens.mint(agent_id=agent.id, kernel_id=kernel[0],
                                container_id=kernel[1].id, target="service:web")
    forged = forged[:-4] + ("AAAA" if not forged.endswith("AAAA") else "BBBB")
    expired = token(agent, kernel, "service:web", ttl=1, now=time.time() - 5)
    for bad in ("", "nonsense", forged, expired,
                token(agent, kernel, "service:web", agent_id="another-agent"),
                token(agent, kernel, "pty:t1")):  # a terminal's token opens no app
        status, body, _ = run(get(server, "/v1/app/index.html", bad))
        assert status == 403, (bad, body)
        assert json.loads(body)["error"].startswith("token refused")


def test_a_token_for_a_container_that_is_not_the_kernels_is_refused(
        agent_and_server, kernel, docker_client):
    agent, server = agent_and_server
    other = docker_client.containers.run(IMAGE, ["sleep", "60"], detach=True)  # not ours
    try:
        forged_pair = stream_tokens.mint(agent_id=agent.id, kernel_id=kernel[0],
                                         container_id=other.id, target="service:web")
        assert run(get(server, "/v1/app/", forged_pair))[0] == 404
        wrong_kernel = stream_tokens.mint(agent_id=agent.id, kernel_id=str(uuid.uuid4()),
                                          container_id=kernel[1].id, target="service:web")
        assert run(get(server, "/v1/app/", wrong_kernel))[0] == 404
    finally:
        other.remove(force=True)


def test_app_http_is_proxied_with_its_path_and_streamed(agent_and_server, kernel):
    agent, server = agent_and_server
    status, body, _ = run(get(server, "/v1/app/index.html", token(agent, kernel, "service:web")))
    assert (status, body) == (200, b"hello-from-the-app\n")
    status, body, _ = run(get(server, "/v1/app/big", token(agent, kernel, "service:web")))
    assert status == 200 and len(body) == 3_000_000

    async def post():
        async with aiohttp.ClientSession() as http, http.post(
                f"http://{server.address}/v1/app/cgi-bin/echo?x=1",
                headers={TOKEN_HEADER: token(agent, kernel, "service:web"),
                         "Cookie": "jupyter=1"}, data=b"the body") as response:
            return response.status, await response.text()

    status, text = run(post())
    assert status == 200
    assert text == "POST /cgi-bin/echo?x=1 cookie=jupyter=1\nthe body"


def test_undeclared_and_tcp_services_are_not_proxied(agent_and_server, kernel):
    agent, server = agent_and_server
    assert run(get(server, "/v1/app/", token(agent, kernel, "service:nope")))[0] == 404
    assert run(get(server, "/v1/app/", token(agent, kernel, "service:raw")))[0] == 400


async def open_terminal(server, token_value, cols=80, rows=24):
    http = aiohttp.ClientSession()
    ws = await http.ws_connect(f"http://{server.address}/v1/pty?cols={cols}&rows={rows}",
                               headers={TOKEN_HEADER: token_value})
    return http, ws


async def read_until(ws, needle, timeout=15):
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        message = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
        if message.type == aiohttp.WSMsgType.BINARY:
            seen += message.data
        elif message.type != aiohttp.WSMsgType.TEXT:
            raise AssertionError(f"{message} before {needle!r}: {seen[-500:]!r}")
    return seen


def test_terminal_runs_a_shell_with_a_tty_resizes_resumes_and_closes(agent_and_server, kernel):
    agent, server = agent_and_server
    terminal = f"t{uuid.uuid4().hex[:8]}"

    async def scenario():
        http, ws = await open_terminal(server, token(agent, kernel, f"pty:{terminal}"), 100, 30)
        await ws.send_bytes(b"tty; stty size; echo $((6*7))x\n")
        seen = await read_until(ws, b"42x")
        assert b"/dev/pts/" in seen and b"30 100" in seen
        await ws.send_str(json.dumps({"resize": [120, 40]}))
        await asyncio.sleep(0.3)
        await ws.send_bytes(b'stty size; A=resumed; echo pid-"$$"-"e"nd\n')
        seen = await read_until(ws, b"-end\r\n")  # the echoed line says -"e"nd
        assert b"40 120" in seen
        pid = int(re.search(rb"pid-(\d+)-end", seen).group(1))
        await ws.close()  # a dropped connection: the shell lives on
        await http.close()
        assert (kernel[0], terminal) in server.terminals
        http, ws = await open_terminal(server, token(agent, kernel, f"pty:{terminal}"))
        await ws.send_bytes(b"echo again-$A\n")
        await read_until(ws, b"again-resumed")
        await ws.send_str(json.dumps({"close": True}))
        await ws.receive(timeout=5)
        await http.close()
        return pid

    pid = run(scenario())
    wait_for(lambda: (kernel[0], terminal) not in server.terminals, timeout=10,
             message="the closed terminal to go")
    # The endpoint's event loop (in this process) watches no socket the terminal closed.
    assert stale_epoll_registrations() == []
    # 30 s: under the load of several suites at once a detached docker exec (the kill)
    # has been seen to start more than 10 s late.
    started = time.monotonic()
    wait_for(lambda: kernel[1].exec_run(["kill", "-0", str(pid)]).exit_code != 0, timeout=30,
             message=f"the shell {pid} to end")
    print(f"the shell ended {time.monotonic() - started:.1f} s after its close")


def test_a_terminal_token_for_another_kernel_opens_nothing(agent_and_server, kernel):
    agent, server = agent_and_server
    forged = stream_tokens.mint(agent_id=agent.id, kernel_id=str(uuid.uuid4()),
                                container_id=kernel[1].id, target="pty:abc")

    async def attempt():
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"http://{server.address}/v1/pty",
                                      headers={TOKEN_HEADER: forged})
            return refused.value.status

    assert run(attempt()) == 404


def test_a_service_started_with_the_kernel_is_waited_for_not_started_again(
        agent_and_server, docker_client):
    """Opening an app while it is still starting (started with the kernel, not listening
    yet) waits for it; a second copy is started only when this agent has not started one
    in the last SERVICE_START_WAIT seconds."""
    agent, server = agent_and_server
    kernel_id = str(uuid.uuid4())
    start = "echo start >> /www/starts; sleep 2; exec httpd -f -p 8080 -h /www"
    container = docker_client.containers.run(
        IMAGE, ["/bin/sh", "-c", "mkdir -p /www && echo slow-app > /www/index.html && "
                                 "exec sleep 3600"], detach=True,
        labels={backend.AGENT_ID: agent.id, backend.KERNEL_ID: kernel_id,
                stream_tokens.SERVICE_PORTS_LABEL: "web:http:8080",
                stream_tokens.SERVICE_START_LABEL + "web": start})
    try:
        container.reload()
        services.start_services(docker_client, container)  # as the agent does at start
        status, body, _ = run(get(server, "/v1/app/index.html",
                                  token(agent, (kernel_id, container), "service:web")))
        assert (status, body) == (200, b"slow-app\n")
        assert container.exec_run(["cat", "/www/starts"]).output == b"start\n"
    finally:
        container.remove(force=True)
