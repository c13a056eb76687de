"""The Backend.AI GraphQL at /admin/gql (sessions_app/compat/graphql.py), through Django's
test client with signed requests, without Docker: the queries are the ones the clients'
commands send (backend-ai-client 23.9.10 and 26.9.6, ai/backend/client/func/*.py and
cli/), the answers their shapes, and who sees what. The real CLIs against a running
server are in live/test_compat_cli_graphql.py."""

import json

import pytest
from django.db import connection
from graphene_django.settings import DEFAULTS, IMPORT_STRINGS, GrapheneSettings

from sessions_app.enums import Status
from tests.factories import make_agent, make_session
from tests.signing import signed_call

# What `session list` / `ps` / `admin session list` ask (fetch_paginated_result and
# cli/session/__init__.py of 26.9.6; 23.9.10's differs only in its field list).
SESSION_FIELDS_26 = ("name access_key id group_name type image status status_info "
                     "status_changed result")
SESSION_FIELDS_23 = ("name access_key id group_name main_kernel_id image type status "
                     "status_info status_changed result")
ACTIVE = "PENDING,SCHEDULED,PULLING,PREPARED,PREPARING,CREATING,RUNNING,RUNNING_DEGRADED," \
         "TERMINATING,ERROR"
LIST_QUERY = """query($limit:Int!, $offset:Int!, $status: String, $access_key: String, \
$filter: String, $order: String) {
  compute_session_list(
      limit:$limit, offset:$offset, status:$status, access_key:$access_key, filter:$filter, \
order:$order) {
    items { %s }
    total_count
  }
}"""
CONTAINERS = ("containers { id cluster_role cluster_idx cluster_hostname session_id image "
              "registry status status_info status_data status_changed agent container_id "
              "resource_opts occupied_slots preopen_ports live_stat last_stat }")
INFO_QUERY = ("query($id: UUID!) {  compute_session(id: $id) {    name id main_kernel_id "
              "image tag created_at terminated_at status status_info status_data "
              f"occupying_slots idle_checks {CONTAINERS} dependencies {{ name id }}  }}}}")
KEYPAIR_INFO = "query { keypair { user_id access_key secret_key is_active is_admin } }"
AGENT_LIST = """query($limit:Int!, $offset:Int!, $status: String, $scaling_group: String, \
$filter: String, $order: String) {
  agent_list(
      limit:$limit, offset:$offset, status:$status, scaling_group:$scaling_group, \
filter:$filter, order:$order) {
    items { id status architecture scaling_group region first_contact cpu_cur_pct \
mem_cur_bytes available_slots occupied_slots }
    total_count
  }
}"""
IMAGES = """query($is_operation: Boolean) {
    images(is_operation: $is_operation) {
        name registry architecture tag digest size_bytes aliases
    }
}"""
KEYPAIR_LIST = """query($limit:Int!, $offset:Int!, $is_active: Boolean, $domain_name: String, \
$filter: String, $order: String) {
  keypair_list(
      limit:$limit, offset:$offset, is_active:$is_active, domain_name:$domain_name, \
filter:$filter, order:$order) {
    items { user_id projects user_info { full_name } access_key secret_key is_active \
is_admin created_at last_used resource_policy rate_limit concurrency_used }
    total_count
  }
}"""


def gql(client, keypair, query, variables=None, path="/admin/gql"):
    response = signed_call(client, keypair, "POST", path,
                           {"query": query, "variables": variables or {}})
    assert response["Content-Type"] == "application/json", response.content
    return response


def data_of(client, keypair, query, variables=None):
    response = gql(client, keypair, query, variables)
    body = response.json()
    assert response.status_code == 200 and "errors" not in body, body
    return body["data"]


def session_list(client, keypair, status=ACTIVE, fields=SESSION_FIELDS_26, **variables):
    variables = {"status": status, "access_key": None, "filter": None, "order": None,
                 "limit": 20, "offset": 0, **variables}
    return data_of(client, keypair, LIST_QUERY % fields, variables)["compute_session_list"]


@pytest.fixture
def sessions(alice, bob):
    agent = make_agent()
    return {"running": make_session(alice, Status.RUNNING, agent=agent, name="a-run"),
            "pending": make_session(alice, Status.PENDING, name="a-wait"),
            "gone": make_session(alice, Status.TERMINATED, agent=agent, name="a-gone"),
            "bobs": make_session(bob, Status.RUNNING, agent=agent, name="b-run")}


@pytest.mark.parametrize("fields", [SESSION_FIELDS_26, SESSION_FIELDS_23])
def test_session_list_answers_the_clients_query_with_a_users_own_active_sessions(
        client, alice_keypair, sessions, fields):
    page = session_list(client, alice_keypair, fields=fields)
    assert page["total_count"] == 2
    assert sorted(item["name"] for item in page["items"]) == ["a-run", "a-wait"]
    running = next(item for item in page["items"] if item["name"] == "a-run")
    session = sessions["running"]
    assert running["id"] == str(session.pk) and running["access_key"] == alice_keypair.access_key
    assert running["status"] == "RUNNING" and running["type"] == "INTERACTIVE"
    assert running["result"] == "UNDEFINED" and running["group_name"] == "default"
    assert running["image"] == "bai-local/busybox:latest"
    if "main_kernel_id" in fields:
        assert running["main_kernel_id"] == str(session.main_kernel.pk)


def test_session_list_status_filters_as_the_cli_sends_them(client, alice_keypair, sessions):
    dead = session_list(client, alice_keypair, status="CANCELLED,TERMINATED")
    assert [item["name"] for item in dead["items"]] == ["a-gone"]
    running = session_list(client, alice_keypair, status="CREATING,RUNNING,RUNNING_DEGRADED")
    assert [item["name"] for item in running["items"]] == ["a-run"]
    assert session_list(client, alice_keypair, status="ALL_UNKNOWN")["total_count"] == 0


def test_session_list_pages_by_limit_and_offset(client, alice_keypair, sessions):
    everything = ",".join(Status)
    first = session_list(client, alice_keypair, status=everything, limit=2, offset=0,
                         order="+name")
    second = session_list(client, alice_keypair, status=everything, limit=2, offset=2,
                          order="+name")
    assert first["total_count"] == second["total_count"] == 3
    assert [i["name"] for i in first["items"]] == ["a-gone", "a-run"]
    assert [i["name"] for i in second["items"]] == ["a-wait"]


def test_admin_sees_every_users_sessions_and_may_narrow_by_access_key(
        client, admin_keypair, bob_keypair, sessions):
    names = {item["name"] for item in session_list(client, admin_keypair)["items"]}
    assert names == {"a-run", "a-wait", "b-run"}
    bobs = session_list(client, admin_keypair, access_key=bob_keypair.access_key)
    assert [item["name"] for item in bobs["items"]] == ["b-run"]


def test_a_user_naming_another_users_access_key_sees_nothing(client, alice_keypair, bob_keypair,
                                                             sessions):
    assert session_list(client, alice_keypair, access_key=bob_keypair.access_key)["items"] == []


def test_session_info_answers_the_clients_query(client, alice_keypair, sessions):
    session = sessions["running"]
    info = data_of(client, alice_keypair, INFO_QUERY, {"id": str(session.pk)})["compute_session"]
    assert info["name"] == "a-run" and info["id"] == str(session.pk)
    assert info["status"] == "RUNNING" and info["dependencies"] == []
    # JSON values are JSON strings, as the client's formatters json.loads them.
    assert json.loads(info["occupying_slots"]) == session.occupying_slots
    assert isinstance(json.loads(info["status_data"]), dict)
    assert isinstance(json.loads(info["idle_checks"]), dict)
    [container] = info["containers"]
    kernel = session.main_kernel
    assert container["id"] == str(kernel.pk) and container["agent"] == "agent-1"
    assert container["cluster_role"] == "main" and container["session_id"] == str(session.pk)
    assert container["container_id"] == kernel.container_id
    assert json.loads(container["occupied_slots"]) == kernel.occupied_slots


def test_session_info_of_another_users_session_is_null(client, alice_keypair, sessions):
    bobs = sessions["bobs"]
    assert data_of(client, alice_keypair, INFO_QUERY, {"id": str(bobs.pk)}) == \
        {"compute_session": None}


def test_session_info_lists_dependencies(client, alice, alice_keypair, sessions):
    child = make_session(alice, Status.PENDING, name="child",
                         dependencies=[sessions["running"]])
    info = data_of(client, alice_keypair, INFO_QUERY, {"id": str(child.pk)})["compute_session"]
    assert info["dependencies"] == [{"name": "a-run", "id": str(sessions["running"].pk)}]


def test_keypair_info_is_the_callers_with_its_admin_flag(client, alice_keypair, admin_keypair, db):
    mine = data_of(client, alice_keypair, KEYPAIR_INFO)["keypair"]
    assert mine == {"user_id": "alice@example.com", "access_key": alice_keypair.access_key,
                    "secret_key": alice_keypair.secret_key, "is_active": True, "is_admin": False}
    assert data_of(client, admin_keypair, KEYPAIR_INFO)["keypair"]["is_admin"] is True


def test_agent_list_for_admins_only(client, alice_keypair, admin_keypair, sessions):
    variables = {"status": "ALIVE", "scaling_group": None, "filter": None, "order": None,
                 "limit": 20, "offset": 0}
    page = data_of(client, admin_keypair, AGENT_LIST, variables)["agent_list"]
    assert page["total_count"] == 1
    [agent] = page["items"]
    assert agent["id"] == "agent-1" and agent["status"] == "ALIVE"
    assert agent["scaling_group"] == "default"
    assert json.loads(agent["available_slots"])["cpu"] == "4"
    assert json.loads(agent["occupied_slots"])  # the running sessions' slots
    refused = gql(client, alice_keypair, AGENT_LIST, variables)
    body = refused.json()
    assert refused.status_code == 200 and body["data"] == {"agent_list": None}
    assert "administrators" in body["errors"][0]["message"]


def test_images_for_everyone_with_name_and_tag_apart(client, alice_keypair, sessions):
    images = data_of(client, alice_keypair, IMAGES, {"is_operation": False})["images"]
    assert {"name": "bai-local/busybox", "tag": "latest", "registry": "local",
            "architecture": "x86_64", "digest": "", "size_bytes": 0,
            "aliases": []} in images
    assert data_of(client, alice_keypair, IMAGES, {"is_operation": True})["images"] == []


def test_keypair_list_users_see_their_own_admins_all_and_secrets_only_their_own(
        client, alice_keypair, bob_keypair, admin_keypair):
    variables = {"is_active": None, "domain_name": None, "filter": None, "order": None,
                 "limit": 20, "offset": 0}
    own = data_of(client, alice_keypair, KEYPAIR_LIST, variables)["keypair_list"]
    assert [item["access_key"] for item in own["items"]] == [alice_keypair.access_key]
    assert own["items"][0]["secret_key"] == alice_keypair.secret_key
    every = data_of(client, admin_keypair, KEYPAIR_LIST, variables)["keypair_list"]
    by_key = {item["access_key"]: item for item in every["items"]}
    assert set(by_key) >= {alice_keypair.access_key, bob_keypair.access_key,
                           admin_keypair.access_key}
    assert by_key[bob_keypair.access_key]["secret_key"] is None
    assert by_key[bob_keypair.access_key]["user_id"] == "bob@example.com"
    assert by_key[bob_keypair.access_key]["user_info"] == {"full_name": "bob"}
    assert by_key[admin_keypair.access_key]["secret_key"] == admin_keypair.secret_key


def test_unsigned_or_badly_signed_requests_are_refused_in_the_graphql_envelope(
        client, alice_keypair):
    response = client.post("/admin/gql", {"query": KEYPAIR_INFO},
                           content_type="application/json")
    assert response.status_code in (401, 403)
    assert response["Content-Type"] == "application/json"
    assert response.json()["errors"][0]["message"]
    forged = signed_call(client, alice_keypair, "POST", "/admin/gql", {"query": KEYPAIR_INFO},
                         secret="x" * 40)
    assert forged.status_code == 401 and forged.json()["errors"]


@pytest.mark.parametrize("body", ["{not json", json.dumps([1, 2]), json.dumps({})])
def test_malformed_bodies_are_answered_in_the_envelope(client, alice_keypair, body):
    from tests.signing import signed_headers
    headers = signed_headers(alice_keypair.access_key, alice_keypair.secret_key, "POST",
                             "/admin/gql", "testserver")
    headers.pop("Content-Type")
    response = client.post("/admin/gql", body, content_type="application/json",
                           headers=headers)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["errors"][0]["message"]


def test_query_errors_are_answered_in_the_envelope(client, alice_keypair, db):
    unknown = gql(client, alice_keypair, "query { no_such_field }")
    assert unknown.status_code == 400 and "no_such_field" in \
        unknown.json()["errors"][0]["message"]
    mutation = gql(client, alice_keypair, "mutation { anything }")
    assert mutation.status_code == 400 and mutation.json()["errors"]
    filtered = gql(client, alice_keypair, LIST_QUERY % "name",
                   {"limit": 20, "offset": 0, "filter": 'name == "x"'})
    assert filtered.json()["errors"][0]["message"].startswith("Filter expressions")
    too_big = gql(client, alice_keypair, LIST_QUERY % "name", {"limit": 1000, "offset": 0})
    assert "limit" in too_big.json()["errors"][0]["message"]


def test_the_admin_site_keeps_its_place(client, db):
    response = client.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_the_old_graphql_path_answers_the_same(client, alice_keypair):
    response = gql(client, alice_keypair, KEYPAIR_INFO, path="/admin/graphql")
    assert response.json()["data"]["keypair"]["access_key"] == alice_keypair.access_key


def test_session_list_narrows_by_domain_and_project(client, alice_keypair, sessions):
    query = """query($domain_name: String, $group_id: String) {
      compute_session_list(limit: 20, offset: 0, status: "RUNNING,PENDING,TERMINATED",
                           domain_name: $domain_name, group_id: $group_id) { total_count }
    }"""

    def count(**variables):
        return data_of(client, alice_keypair, query, variables)["compute_session_list"][
            "total_count"]

    project_id = str(sessions["running"].project_id)
    assert count(domain_name="default", group_id=project_id) == 3
    assert count(domain_name="other") == 0
    assert count(group_id="2b7e5d3c-0000-4000-8000-000000000000") == 0


def test_a_page_of_sessions_costs_the_same_queries_for_one_or_many(client, alice, alice_keypair):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fields = f"{SESSION_FIELDS_23} occupying_slots {CONTAINERS}"

    def queries():
        with CaptureQueriesContext(connection) as captured:
            session_list(client, alice_keypair, fields=fields)
        return len(captured)

    agent = make_agent()
    make_session(alice, Status.RUNNING, agent=agent, name="one")
    few = queries()
    for number in range(4):
        make_session(alice, Status.RUNNING, agent=agent, name=f"more{number}")
    assert queries() == few


def test_a_query_leaves_no_sql_recorder_on_the_database_connection(client, alice_keypair,
                                                                      sessions):
    """graphene-django adds its SQL debug middleware when DEBUG is on as it loads (the
    default of a development server, and of a test run that imports the schema while
    collecting): its cursor wrapper stayed on the connection and recorded every later
    query, and on SQLite it broke executemany (the usage rollup's)."""
    # The settings win over the defaults graphene-django builds with DEBUG on, whatever
    # DEBUG was when it loaded in this run:
    debug_defaults = {**DEFAULTS, "MIDDLEWARE": ("graphene_django.debug.DjangoDebugMiddleware",)}
    assert GrapheneSettings(None, debug_defaults, IMPORT_STRINGS).MIDDLEWARE == []
    session_list(client, alice_keypair)
    assert not hasattr(connection, "_graphene_cursor")
