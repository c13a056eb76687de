"""Who may call which route: every route and method of the URL configuration, every GraphQL
query and mutation field, and every websocket route, against every role, with the answer
each role gets, kept as data in tests/authorization_matrix.yaml.

The routes are walked from the resolver, the GraphQL schema, and the ASGI application (its
Channels routers' websocket routes, `ws <pattern>`, and the app proxy that answers HTTP in
front of Django, `app <pattern>`); a route or method without an entry fails, and so does an
entry without a route. Each answer is checked by making the request with real objects:
alice's RUNNING session (rows only: its agent is a row with no process, so what needs one
answers 503; for the websockets and the app proxy its stream endpoint is a port where
nothing listens, so whoever is let through meets the agent-unreachable answer, 502 or close
4502), her folder, her keypair.

A websocket's answer is "403 handshake (close <code>)" when it is refused before it is
accepted (a client sees only the HTTP 403; the code is the server's reason), else
"accepted" and what it said, in order: "subscribed", "error <status>", "error: <message>",
"closed <code>".

Roles: anonymous; user (alice, who owns the objects); other (bob, who owns nothing here);
project_admin (dave: this system has no project-admin role; dave is a member of alice's
project, which gives him its project folders and nothing of alice's own); admin (erin:
staff, not superuser); superadmin (carol).

Each request runs in a savepoint that is rolled back, so a destroy by one role leaves the
objects for the next. After a reviewed change of behaviour, rewrite the table with
`AUTHZ_MATRIX_WRITE=1 pytest -p no:xdist tests/test_authorization_matrix.py` and review its
diff.
"""

import asyncio
import json
import os
import re
import socket
from http.cookies import SimpleCookie
from pathlib import Path

import pytest
import yaml
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.conf import settings
from django.contrib.admin.sites import site
from django.db import transaction
from django.test import Client
from django.urls import URLResolver, get_resolver

from agents_app.models import Agent, Image
from agents_app.stream_tokens import SERVICE_PORTS_LABEL
from backendai_web import asgi
from identity_app.keypairs import main_keypair
from identity_app.models import Project
from sessions_app.compat.graphql import schema as graphql_schema
from sessions_app.enums import Status
from sessions_app.realtime import agent_client, fanout
from sessions_app.realtime.apps import APP_PATH, AppProxy
from storage_app.folders import create_folder, folder_dir
from tests.conftest import make_user
from tests.factories import make_agent, make_session
from tests.signing import signed_headers

TABLE = Path(__file__).with_name("authorization_matrix.yaml")
ROLES = ("anonymous", "user", "other", "project_admin", "admin", "superadmin")
WRITE = os.environ.get("AUTHZ_MATRIX_WRITE") == "1"
# The Backend.AI routes and GraphQL are called as the SDK calls them: signed with the
# role's keypair; the rest with a browser session.
SIGNED = re.compile(r"^/((session|template|events|resource|config|manager|stream|v2)(/|$)"
                    r"|storage-proxy/|admin/g(ql|raphql)$|folders(/[^?]*[^/])?$)")


def walk(resolver=None, prefix=""):
    for pattern in (resolver or get_resolver()).url_patterns:
        if isinstance(pattern, URLResolver):
            yield from walk(pattern, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern


def methods_of(pattern):
    """The methods a route answers: a viewset's mapped actions, a view class's handlers,
    else GET and POST (function views)."""
    callback = pattern.callback
    actions = getattr(callback, "actions", None)
    if actions:
        # DRF adds HEAD (as GET) to a viewset's mapping at its first request: not a route.
        return sorted(m.upper() for m, action in actions.items()
                      if not (m == "head" and action == actions.get("get")))
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view_class is not None:
        return sorted(m.upper() for m in view_class.http_method_names
                      if m not in ("options", "head", "trace") and hasattr(view_class, m))
    return ["GET", "POST"]


def http_routes():
    routes = {}
    for route, pattern in walk():
        if route.startswith("admin/") and "gql" not in route and "graphql" not in route:
            # The admin's pages: GET is the answer that shows who may see them.
            routes[route] = ["GET"]
        else:
            routes[route] = methods_of(pattern)
    return routes


def graphql_fields():
    fields = {}
    for kind, root in (("query", graphql_schema.graphql_schema.query_type),
                       ("mutation", graphql_schema.graphql_schema.mutation_type)):
        for name in root.fields:
            fields[f"{kind} {name}"] = ["POST"]
    return fields


def request_routes():
    """The URL configuration's routes and the GraphQL fields."""
    return {**http_routes(), **{f"graphql {k}": v for k, v in graphql_fields().items()}}


WEBSOCKET = "WEBSOCKET"  # the method of a websocket route's entry


def _router(app):
    """The URLRouter inside an ASGI middleware stack (origin check, cookies, session, user)."""
    while not isinstance(app, URLRouter):
        app = getattr(app, "application", None) or app.inner
    return app


def _walk_router(router, prefix=""):
    for route in router.routes:
        if isinstance(route.callback, URLRouter):
            yield from _walk_router(route.callback, prefix + str(route.pattern))
        else:
            yield prefix + str(route.pattern)


def websocket_routes():
    """{"ws <pattern>": "browser" (login cookie) or "client" (signed with a keypair)}, from
    the two routers backendai_web.asgi.websockets dispatches to."""
    routes = {}
    for kind, app in (("browser", asgi.browser_websockets), ("client", asgi.client_websockets)):
        for pattern in _walk_router(_router(app)):
            routes[f"ws {pattern}"] = kind
    return routes


def app_proxy_routes():
    """HTTP that the ASGI application answers in front of Django's URL configuration."""
    front = asgi.application.application_mapping["http"]
    if isinstance(front, AppProxy):  # any method is proxied: GET and POST stand for them
        return {f"app {APP_PATH.pattern}": ["GET", "POST"]}
    return {}


def asgi_routes():
    return {**app_proxy_routes(), **{key: [WEBSOCKET] for key in websocket_routes()}}


def all_routes():
    return {**request_routes(), **asgi_routes()}


@pytest.fixture
def world(defaults, alice, bob, carol, django_user_model, monkeypatch, sent, settings,
          tmp_path, client):
    settings.STORAGE_ROOT = tmp_path / "storage"
    client.raise_request_exception = False  # a 500 is an answer the table records

    from celery.exceptions import TimeoutError as CeleryTimeout

    def agent_away(*args, **kwargs):
        raise CeleryTimeout("no agent process in this test")
    monkeypatch.setattr("agents_app.rpc.call", agent_away)
    dave = make_user(django_user_model, "dave")
    erin = make_user(django_user_model, "erin", is_staff=True)
    project = Project.objects.get(name="default")
    project.members.add(alice, dave)
    agent = make_agent("agent-1")
    session = make_session(alice, Status.RUNNING, agent=agent, name="mine")
    policy = main_keypair(alice).resource_policy
    folder = create_folder(user=alice, name="data", policy=policy)
    project_folder = create_folder(user=carol, name="shared", policy=policy, project=project)
    for made in (folder, project_folder):
        folder_dir(made).mkdir(parents=True, exist_ok=True)
    users = {"user": alice, "other": bob, "project_admin": dave, "admin": erin,
             "superadmin": carol}
    return {
        "users": users, "session": session, "kernel": session.kernels.get(),
        "folder": folder, "project_folder": project_folder, "agent": agent,
        "keypair": main_keypair(alice), "image": Image.objects.first(),
        "group": agent.scaling_group, "policy": main_keypair(alice).resource_policy,
    }


def concrete(route, world):
    """The route with its parameters filled with the world's objects."""
    session, folder = world["session"], world["folder"]
    values = {
        "ref": str(session.pk), "pk": str(session.pk), "name": folder.name,
        "folder_id": folder.pk.hex, "path": "a.txt", "rest": "", "object_id": "0",
        "app_label": "sessions_app",
    }
    if route.startswith("api/v1/"):
        kind = re.split(r"[/\\]", route[len("api/v1/"):].lstrip("^"))[0]
        values["pk"] = str({
            "sessions": session.pk, "kernels": world["kernel"].pk,
            "agents": world["agent"].pk, "images": world["image"].pk,
            "keypairs": world["keypair"].pk, "scaling-groups": world["group"].pk,
            "folders": folder.pk, "resource-policies": world["policy"].pk,
        }.get(kind, "0"))
    if route.startswith("folders/") and "<uuid:ref>" in route:
        values["ref"] = str(folder.pk)
    if route.startswith("admin/") and "<path:object_id>" in route:
        model = next((m for m in site._registry
                      if route.startswith(f"admin/{m._meta.app_label}/{m._meta.model_name}/")),
                     None)
        row = model._base_manager.first() if model else None
        values["object_id"] = str(row.pk) if row is not None else "0"
    values["format"] = "json"
    path = route.replace("<drf_format_suffix:format>", ".json").replace("\\.", ".")
    path = path.replace("/?$", "")
    # Regular expressions' groups first (their names look like converters), then the
    # converters; a regular expression takes its shortest path.
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)\??", lambda m: values.get(m.group(1), ""), path)
    path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values.get(m.group(1), "x"), path)
    path = path.replace("^", "").replace("\\Z", "").replace("$", "")
    path = re.sub(r"\(\?:[^)]*\)\?", "", path)
    path = re.sub(r"\(\?:([^|)]*)[^)]*\)", r"\1", path)
    path = path.replace("[-_]", "-").replace("(?:/.*)?", "").replace("(?:/[\\s\\S]*)?", "")
    return "/" + path


def outcome(response):
    status = response.status_code
    if status in (301, 302) and "login" in response.get("Location", ""):
        return "302 login"
    return status


def request_as(client, world, role, method, path, *, signed, body=None):
    # No cookie but the role's own session: one login per role and world (outside the
    # requests' savepoints, so that a request that ends or rotates its session leaves it
    # for the next), not one per request, which was half of this test's time.
    client.cookies = SimpleCookie()
    headers = {}
    user = world["users"].get(role)
    if user is not None:
        if signed:
            keypair = main_keypair(user)
            headers = signed_headers(keypair.access_key, keypair.secret_key, method, path,
                                     "testserver")
        else:
            sessions = world.setdefault("sessions", {})
            if role not in sessions:
                client.force_login(user)
                sessions[role] = client.cookies[settings.SESSION_COOKIE_NAME].value
            client.cookies[settings.SESSION_COOKIE_NAME] = sessions[role]
    for made in (world["folder"], world["project_folder"]):  # a rolled-back delete's
        folder_dir(made).mkdir(parents=True, exist_ok=True)  # files stay deleted on disk
    with transaction.atomic():
        response = client.generic(method, path, body or b"{}",
                                  content_type="application/json", headers=headers)
        transaction.set_rollback(True)
    return response


def graphql_document(key):
    kind, name = key.split(" ", 1)
    root = (graphql_schema.graphql_schema.query_type if kind == "query"
            else graphql_schema.graphql_schema.mutation_type)
    field = root.fields[name]
    args = []
    for arg_name, arg in field.args.items():
        if str(arg.type).endswith("!"):
            args.append(f'{arg_name}: {_dummy(arg.type)}')
    call = f"{name}({', '.join(args)})" if args else name
    inner = field.type
    while hasattr(inner, "of_type"):
        inner = inner.of_type
    selection = " { __typename }" if hasattr(inner, "fields") else ""
    return f"{kind} {{ {call}{selection} }}"


def _dummy(type_):
    text = str(type_).rstrip("!")
    if text.startswith("["):
        return "[]"
    return {"Int": "1", "Float": "1.0", "Boolean": "false"}.get(text, '"x"') \
        if not text.endswith("Input") else "{}"


def graphql_outcome(response):
    if response.status_code != 200:
        return response.status_code
    body = response.json()
    errors = body.get("errors") or []
    if not errors:
        return "ok"
    message = errors[0].get("message", "").lower()
    if any(word in message for word in ("permission", "not allowed", "only admin",
                                        "administrator", "superadmin", "forbidden")):
        return "refused"
    if "not found" in message or "no such" in message or "there is no" in message:
        return "not found"
    return "error"


def answers(client, world, key, method):
    row = {}
    for role in ROLES:
        if key.startswith("graphql "):
            document = graphql_document(key.split(" ", 1)[1])
            response = request_as(client, world, role, "POST", "/admin/gql", signed=True,
                                  body=json.dumps({"query": document}).encode())
            row[role] = graphql_outcome(response) if response.status_code == 200 \
                else response.status_code
        else:
            path = concrete(key, world)
            response = request_as(client, world, role, method, path,
                                  signed=bool(SIGNED.match(path)))
            row[role] = outcome(response)
    return row


def table():
    return yaml.safe_load(TABLE.read_text()) if TABLE.exists() else {}


def test_every_route_and_method_has_an_entry_and_every_entry_a_route():
    routes = {(route, method) for route, methods in all_routes().items()
              for method in methods}
    entries = {(route, method) for route, by_method in table().items()
               for method in by_method}
    if WRITE:
        pytest.skip("writing the table")
    assert sorted(routes - entries) == [], "routes without an entry in the matrix"
    assert sorted(entries - routes) == [], "entries whose route is gone"


SHARDS = 8  # the routes in eight tests, so that pytest-xdist spreads them over its workers


@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_role_gets_the_answer_the_matrix_says(client, world, shard):
    expected = table()
    routes = sorted(request_routes().items())
    found, wrong = {}, []
    for route, methods in routes[shard::SHARDS]:
        for method in methods:
            row = answers(client, world, route, method)
            found.setdefault(route, {})[method] = row
            if not WRITE and expected.get(route, {}).get(method) != row:
                wrong.append(f"{method} {route}: expected {expected.get(route, {}).get(method)}"
                             f", got {row}")
    if WRITE:  # one shard after another (-p no:xdist): each rewrites its own routes
        write_table(expected, found)
        pytest.skip(f"wrote shard {shard} of {TABLE}")
    assert wrong == []


def write_table(expected, found):
    """The table with `found` in place, less the entries whose route is gone."""
    routes = all_routes()
    written = {route: by_method for route, by_method in expected.items() if route in routes}
    written.update(found)
    TABLE.write_text(yaml.safe_dump(written, sort_keys=True, width=120))


# The websockets and the app proxy, one test per route (pytest-xdist spreads them).

SERVICE = "jupyter"  # the app the session's image declares here
SETTLE = 5  # seconds for a websocket's first answer (the database runs on this thread)
QUIET = 0.3  # after its last message: nothing more within this means it stays open


@pytest.fixture
def stream_world(world, monkeypatch):
    """The world with the agent's stream endpoint a port where nothing listens (the agent
    unreachable: a refused connection, at once), the image declaring SERVICE, and each
    role's login cookie.

    The consumers' database calls run on the test's thread (async_to_sync from it), inside
    its transaction: Channels' close_old_connections() around them would close the
    connection there, as Django's test client keeps it from doing for HTTP requests."""
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)

    async def kept():
        pass
    monkeypatch.setattr("channels.consumer.aclose_old_connections", kept)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    Agent.objects.filter(pk=world["agent"].pk).update(stream_addr=f"127.0.0.1:{port}")
    Image.objects.filter(name=world["session"].image).update(
        labels={SERVICE_PORTS_LABEL: f"{SERVICE}:http:8888"})
    cookies = {}
    for role, user in world["users"].items():
        browser = Client()
        browser.force_login(user)
        cookies[role] = f"sessionid={browser.cookies['sessionid'].value}"
    return {**world, "cookies": cookies}


def asgi_path(route, world):
    """The route's pattern with alice's session, SERVICE, terminal t1 in its groups. A route
    that names no session (the events socket) is asked about hers in its query."""
    session_id = str(world["session"].pk)
    values = {"session_id": session_id, "ref": session_id, "terminal_id": "t1",
              "name": SERVICE, "rest": "/"}
    path = route.split(" ", 1)[1]
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)\??", lambda m: values[m.group(1)], path)
    path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m.group(1)], path)
    path = "/" + path.replace("^", "").replace("$", "").replace("//", "/").lstrip("/")
    if session_id not in path:
        path += f"?session={session_id}"
    return path


def handshake_headers(world, role, kind, path):
    headers = [(b"host", b"testserver")]
    user = world["users"].get(role)
    if kind == "client":  # as the SDK opens its streams: signed, no cookie, no Origin
        if user is not None:
            keypair = main_keypair(user)
            signed = signed_headers(keypair.access_key, keypair.secret_key, "GET",
                                    path.split("?")[0], "testserver",
                                    content_type="application/octet-stream")
            signed.pop("Content-Type")
            headers += [(k.lower().encode(), v.encode()) for k, v in signed.items()]
    else:
        headers.append((b"origin", b"http://testserver"))
        if user is not None:
            headers.append((b"cookie", world["cookies"][role].encode()))
    return headers


def said(text):
    try:
        message = json.loads(text)
    except (TypeError, ValueError):
        return "data"
    if not isinstance(message, dict):
        return "data"
    if "event" in message:  # the events socket
        return f"error: {message.get('reason')}" if message["event"] == "error" \
            else message["event"]
    if "error" in message:  # a terminal: {"error", "status"}
        return f"error {message.get('status')}"
    if message.get("status") == "error":  # a streamed execution
        return f"error: {message.get('msg')}"
    return str(message.get("status") or message.get("type") or "message")


async def on_its_own_loop(answer):
    """`answer`, then what the loop's agent client and event fan-out leave open."""
    try:
        return await answer
    finally:
        loop = asyncio.get_running_loop()
        session = agent_client._sessions.pop(loop, None)
        if session is not None:
            await session.close()
        hub = fanout._per_loop.pop(loop, None)
        if hub is not None and hub.task is not None:
            hub.task.cancel()


async def websocket_answer(path, headers, first):
    communicator = WebsocketCommunicator(asgi.application, path, headers=headers)
    connected, code = await communicator.connect(timeout=SETTLE)
    try:
        if not connected:
            return f"403 handshake (close {code})"
        if first is not None:
            await communicator.send_to(text_data=first)
        answer, timeout = ["accepted"], SETTLE
        while not await communicator.receive_nothing(timeout=timeout):
            output = await communicator.receive_output()
            if output["type"] == "websocket.close":
                answer.append(f"closed {output.get('code', 1000)}")
                break
            answer.append(said(output.get("text")))
            timeout = QUIET
        return ", ".join(answer)
    finally:
        await communicator.disconnect()


async def http_answer(method, path, headers):
    communicator = HttpCommunicator(asgi.application, method, path, b"", headers=headers)
    response = await communicator.get_response(timeout=SETTLE)
    location = dict(response["headers"]).get(b"location", b"")
    return "302 login" if response["status"] == 302 and b"login" in location \
        else response["status"]


def first_frame(path):
    """A streamed execution waits for its request before it goes to the agent."""
    if path.endswith("/execute"):
        return json.dumps({"mode": "query", "code": "print(1)"})
    return None


def asgi_answers(world, route, method):
    kind = websocket_routes().get(route, "browser")
    path = asgi_path(route, world)
    row = {}
    for role in ROLES:
        headers = handshake_headers(world, role, kind, path)
        with transaction.atomic():  # what a role's stream writes (activity) is undone
            if method == WEBSOCKET:
                answer = websocket_answer(path, headers, first_frame(path))
            else:
                answer = http_answer(method, path, headers)
            row[role] = async_to_sync(on_its_own_loop)(answer)
            transaction.set_rollback(True)
    return row


@pytest.mark.parametrize("route", sorted(asgi_routes()),
                         ids=lambda route: re.sub(r"[^a-z]+", "-", route.lower())[:48])
def test_every_role_gets_the_websocket_or_app_proxy_answer_the_matrix_says(
        stream_world, route):
    expected = table()
    found = {route: {method: asgi_answers(stream_world, route, method)
                     for method in asgi_routes()[route]}}
    if WRITE:
        write_table(expected, found)
        pytest.skip(f"wrote {route} in {TABLE}")
    assert found[route] == expected.get(route)
