"""The GraphQL that the 26.9.6 SDK sends beyond the everyday commands (API v8), through
Django's test client with signed requests: the Relay node of ComputeSession.detail, the
keypair resource policies, resource presets, and the mutations of KeyPair,
KeypairResourcePolicy, ComputeSession.update and Image. The queries are the SDK's own
text (ai/backend/client/func/*.py), printed by its Python."""

import base64
import json

import pytest

from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.models import ResourcePreset, default_of
from sessions_app.enums import Status
from sessions_app.models import Session
from storage_app.models import Folder, Mount
from tests.factories import make_agent, make_session
from tests.signing import signed_call

S = Status
# ComputeSession.detail(): _default_session_node_detail_fields, as the SDK writes them.
DETAIL_FIELDS = (
    "row_id tag name type priority cluster_mode domain_name user_id status created_at "
    "terminated_at resource_opts scaling_group vfolder_mounts image_references kernel_nodes "
    "{ edges { node { row_id image_reference status created_at agent_id row_id } node { "
    "row_id image_reference status created_at agent_id row_id } } edges { node { row_id "
    "image_reference status created_at agent_id row_id } node { row_id image_reference status "
    "created_at agent_id row_id } } }")
DETAIL = ("query($id: GlobalIDField!) {\n    compute_session_node(id: $id) {\n        "
          + DETAIL_FIELDS + "\n    }\n}\n")
POLICY_FIELDS = ("name created_at total_resource_slots max_concurrent_sessions idle_timeout "
                 "max_containers_per_session allowed_vfolder_hosts max_session_lifetime "
                 "max_pending_session_count max_pending_session_resource_slots "
                 "max_concurrent_sftp_sessions")


@pytest.fixture
def staff_kp(django_user_model, defaults):
    """An admin who is not a superadmin."""
    return main_keypair(django_user_model.objects.create_user("dave", "dave@example.com",
                                                              is_staff=True))


def gql(client, keypair, query, variables=None):
    response = signed_call(client, keypair, "POST", "/admin/gql",
                           {"query": query, "variables": variables or {}})
    return response.status_code, response.json()


def global_id(session):
    return base64.b64encode(f"compute_session_node:{session.pk}".encode()).decode()


def test_session_detail_answers_the_sdks_relay_query(client, alice, alice_keypair):
    make_agent()
    session = make_session(alice, S.RUNNING, name="pair", cluster_size=2, tag="t")
    folder = Folder.objects.create(name="data", user=alice,
                                   scaling_group=session.scaling_group)
    Mount.objects.create(session=session, folder=folder, path="/home/work/data")
    status, body = gql(client, alice_keypair, DETAIL, {"id": global_id(session)})
    assert status == 200 and "errors" not in body, body
    node = body["data"]["compute_session_node"]
    assert (node["row_id"], node["name"], node["type"], node["status"], node["tag"]) == (
        str(session.pk), "pair", "INTERACTIVE", "RUNNING", "t")
    assert node["vfolder_mounts"] == [str(folder.pk)]
    assert node["image_references"] == ["bai-local/busybox:latest"]
    kernels = [edge["node"] for edge in node["kernel_nodes"]["edges"]]
    main = session.main_kernel
    assert [k["row_id"] for k in kernels][0] == str(main.pk)
    assert {k["agent_id"] for k in kernels} == {"agent-1"} and len(kernels) == 2


def test_session_detail_takes_a_bare_id_and_hides_another_users_session(
        client, alice, alice_keypair, bob_keypair):
    session = make_session(alice, name="mine")
    query = "query($id: GlobalIDField!) { compute_session_node(id: $id) { row_id " \
            "kernel_nodes { count } dependees { count } graph { edges { node { name } } } } }"
    _, body = gql(client, alice_keypair, query, {"id": str(session.pk)})
    node = body["data"]["compute_session_node"]
    assert node["row_id"] == str(session.pk) and node["kernel_nodes"]["count"] == 1
    assert node["graph"]["edges"] == [{"node": {"name": "mine"}}]
    _, body = gql(client, bob_keypair, query, {"id": global_id(session)})
    assert body["data"]["compute_session_node"] is None
    _, body = gql(client, alice_keypair, query, {"id": "not-an-id"})
    assert "Not a session's global id" in body["errors"][0]["message"]


def test_keypair_resource_policies_as_the_sdk_asks_them(client, alice_keypair, admin_keypair):
    ResourcePolicy.objects.create(name="gpu", total_resource_slots={"cpu": "8"})
    query = f"query($name: String) {{ keypair_resource_policy(name: $name) {{ {POLICY_FIELDS} }} }}"
    _, body = gql(client, alice_keypair, query, {"name": "default"})
    policy = body["data"]["keypair_resource_policy"]
    assert policy["name"] == "default" and policy["max_concurrent_sessions"] == 30
    assert json.loads(policy["total_resource_slots"]) == {}
    _, body = gql(client, alice_keypair, query, {"name": "gpu"})  # not one of hers
    assert body["data"]["keypair_resource_policy"] is None
    listing = f"query {{ keypair_resource_policies {{ {POLICY_FIELDS} }} }}"
    _, body = gql(client, alice_keypair, listing)
    assert [p["name"] for p in body["data"]["keypair_resource_policies"]] == ["default"]
    _, body = gql(client, admin_keypair, listing)
    assert [p["name"] for p in body["data"]["keypair_resource_policies"]] == ["default", "gpu"]


CREATE_POLICY = """mutation($name: String!, $input: CreateKeyPairResourcePolicyInput!) {
    create_keypair_resource_policy(name: $name, props: $input) {
        ok msg resource_policy { name }
    }
}"""


def policy_input(**extra):
    """What `backend.ai admin keypair-resource-policy add NAME` sends with its defaults."""
    return {"default_for_unspecified": "UNLIMITED", "total_resource_slots": '{"cpu": "4"}',
            "max_session_lifetime": 0, "max_concurrent_sessions": 30,
            "max_concurrent_sftp_sessions": 30, "max_containers_per_session": 1,
            "idle_timeout": 1800, "allowed_vfolder_hosts": '{"local:volume1": []}',
            "max_pending_session_count": None, "max_pending_session_resource_slots": None,
            **extra}


def test_keypair_resource_policies_are_created_changed_and_deleted_by_superadmins(
        client, admin_keypair, staff_kp):
    _, body = gql(client, staff_kp, CREATE_POLICY, {"name": "p1", "input": policy_input()})
    assert "Only superadmins" in body["errors"][0]["message"]
    _, body = gql(client, admin_keypair, CREATE_POLICY, {"name": "p1", "input": policy_input()})
    made = body["data"]["create_keypair_resource_policy"]
    assert made["ok"] and made["resource_policy"] == {"name": "p1"}
    assert "not applied here: allowed_vfolder_hosts" in made["msg"]
    assert "max_containers_per_session (the server's MAX_CLUSTER_SIZE" in made["msg"]
    policy = ResourcePolicy.objects.get(name="p1")
    assert (policy.total_resource_slots, policy.idle_timeout) == ({"cpu": "4"}, 1800)
    _, body = gql(client, admin_keypair, CREATE_POLICY, {"name": "p1", "input": policy_input()})
    assert body["data"]["create_keypair_resource_policy"]["ok"] is False
    _, body = gql(client, admin_keypair, CREATE_POLICY, {
        "name": "p2", "input": policy_input(default_for_unspecified="LIMITED")})
    assert "default_for_unspecified is UNLIMITED here" in \
        body["data"]["create_keypair_resource_policy"]["msg"]
    modify = """mutation($name: String!, $input: ModifyKeyPairResourcePolicyInput!) {
        modify_keypair_resource_policy(name: $name, props: $input) { ok msg } }"""
    _, body = gql(client, admin_keypair, modify, {"name": "p1", "input": {"idle_timeout": 60}})
    assert body["data"]["modify_keypair_resource_policy"] == {"ok": True, "msg": "success"}
    assert ResourcePolicy.objects.get(name="p1").idle_timeout == 60
    delete = "mutation($name: String!) { delete_keypair_resource_policy(name: $name) { ok msg } }"
    _, body = gql(client, admin_keypair, delete, {"name": "default"})
    assert body["data"]["delete_keypair_resource_policy"]["ok"] is False  # in use
    _, body = gql(client, admin_keypair, delete, {"name": "p1"})
    assert body["data"]["delete_keypair_resource_policy"]["ok"] is True


def test_keypairs_are_created_changed_and_deleted_by_admins(client, alice, alice_keypair,
                                                            staff_kp):
    create = """mutation($user_id: String!, $input: KeyPairInput!) {
        create_keypair(user_id: $user_id, props: $input) {
            ok msg keypair { access_key secret_key } } }"""
    variables = {"user_id": "alice@example.com", "input": {
        "is_active": True, "is_admin": False, "resource_policy": "default", "rate_limit": 500}}
    _, body = gql(client, alice_keypair, create, variables)
    assert "Only administrators" in body["errors"][0]["message"]
    _, body = gql(client, staff_kp, create, variables)
    made = body["data"]["create_keypair"]
    assert made["ok"], made
    keypair = KeyPair.objects.get(pk=made["keypair"]["access_key"])
    assert (keypair.user, keypair.rate_limit, keypair.is_main) == (alice, 500, False)
    assert made["keypair"]["secret_key"] is None  # shown only to the keypair's own holder
    modify = """mutation($access_key: String!, $input: ModifyKeyPairInput!) {
        modify_keypair(access_key: $access_key, props: $input) { ok msg } }"""
    _, body = gql(client, staff_kp, modify, {"access_key": keypair.pk,
                                             "input": {"is_active": False}})
    assert body["data"]["modify_keypair"]["ok"]
    assert not KeyPair.objects.get(pk=keypair.pk).is_active
    delete = "mutation($access_key: String!) { delete_keypair(access_key: $access_key) { ok msg } }"
    _, body = gql(client, staff_kp, delete, {"access_key": alice_keypair.pk})
    assert "main keypair cannot be deleted" in body["data"]["delete_keypair"]["msg"]
    _, body = gql(client, staff_kp, delete, {"access_key": keypair.pk})
    assert body["data"]["delete_keypair"]["ok"]


MODIFY_SESSION = """mutation($input: ModifyComputeSessionInput!) {
    modify_compute_session(input: $input) {
        item { name priority }
        clientMutationId
    }
}"""


def test_a_sessions_name_and_priority_change_as_compute_session_update_sends_them(
        client, alice, alice_keypair, bob_keypair, admin_keypair):
    session = make_session(alice, name="old")
    _, body = gql(client, alice_keypair, MODIFY_SESSION, {"input": {
        "id": str(session.pk), "clientMutationId": "m1", "name": "new", "priority": 5}})
    assert body["data"]["modify_compute_session"] == {
        "item": {"name": "new", "priority": 5}, "clientMutationId": "m1"}
    _, body = gql(client, alice_keypair, MODIFY_SESSION, {"input": {
        "id": str(session.pk), "priority": 50}})
    assert "only an admin may set it higher" in body["errors"][0]["message"]
    _, body = gql(client, admin_keypair, MODIFY_SESSION, {"input": {
        "id": global_id(session), "priority": 50}})
    assert body["data"]["modify_compute_session"]["item"]["priority"] == 50
    _, body = gql(client, bob_keypair, MODIFY_SESSION, {"input": {"id": str(session.pk),
                                                            "priority": 1}})
    assert "There is no session" in body["errors"][0]["message"]
    assert Session.objects.get(pk=session.pk).priority == 50


def test_resource_presets_through_graphql(client, alice_keypair, admin_keypair):
    create = """mutation($name: String!, $input: CreateResourcePresetInput!) {
        create_resource_preset(name: $name, props: $input) {
            ok msg resource_preset { name resource_slots shared_memory scaling_group_name } } }"""
    _, body = gql(client, alice_keypair, create, {"name": "s", "input": {
        "resource_slots": '{"cpu": "1", "mem": "1g"}'}})
    assert "Only superadmins" in body["errors"][0]["message"]
    _, body = gql(client, admin_keypair, create, {"name": "s", "input": {
        "resource_slots": '{"cpu": "1", "mem": "1g"}', "shared_memory": "64m",
        "scaling_group_name": "default"}})
    made = body["data"]["create_resource_preset"]
    assert made["ok"], made
    assert json.loads(made["resource_preset"]["resource_slots"]) == {"cpu": "1",
                                                                     "mem": str(2**30)}
    assert made["resource_preset"]["shared_memory"] == str(64 * 2**20)
    _, body = gql(client, admin_keypair, create, {"name": "bad", "input": {
        "resource_slots": '{"cpu": "1"}'}})
    assert body["data"]["create_resource_preset"] == {
        "ok": False, "msg": "resource_slots must give cpu and mem.", "resource_preset": None}
    modify = """mutation($name: String, $input: ModifyResourcePresetInput!) {
        modify_resource_preset(name: $name, props: $input) { ok msg } }"""
    _, body = gql(client, admin_keypair, modify, {"name": "s", "input": {"name": "small"}})
    assert body["data"]["modify_resource_preset"]["ok"]
    _, body = gql(client, alice_keypair, "{ resource_presets { name } resource_preset(name: "
                                    "\"small\") { scaling_group_name } }")
    assert body["data"] == {"resource_presets": [{"name": "small"}],
                            "resource_preset": {"scaling_group_name": "default"}}
    delete = "mutation { delete_resource_preset(name: \"small\") { ok } }"
    _, body = gql(client, admin_keypair, delete)
    assert body["data"]["delete_resource_preset"]["ok"] and not ResourcePreset.objects.exists()


@pytest.mark.parametrize("mutation, words", [
    ('rescan_images(registry: "r") { ok msg task_id }', "there is no registry to scan"),
    ('forget_image(reference: "x", architecture: "x86_64") { ok msg }',
     "a forgotten image would be back"),
    ('forget_image_by_id(image_id: "1") { ok msg }', "a forgotten image would be back"),
    ('purge_image_by_id(image_id: "1", options: {remove_from_registry: true}) '
     '{ image { name } }', "docker rmi"),
    ('untag_image_from_registry(image_id: "1") { ok msg }', "does not write to registries"),
    ('alias_image(alias: "py", target: "x") { ok msg }', "named by their reference only"),
    ('dealias_image(alias: "py") { ok msg }', "named by their reference only"),
])
def test_image_mutations_this_server_does_not_do_say_why(client, admin_keypair, mutation, words):
    status, body = gql(client, admin_keypair, f"mutation {{ {mutation} }}")
    assert status == 200
    assert "is not supported by this server" in body["errors"][0]["message"]
    assert words in body["errors"][0]["message"]


def test_customized_images_are_those_with_an_owner_label(client, alice, alice_keypair):
    from agents_app.models import Image
    Image.objects.create(name="mine:1", labels={
        "ai.backend.customized-image.owner": f"user:{alice.pk}"})
    Image.objects.create(name="plain:1")
    _, body = gql(client, alice_keypair, "{ customized_images { name tag } }")
    assert body["data"]["customized_images"] == [{"name": "mine", "tag": "1"}]


def test_the_policy_info_without_a_name_is_the_callers(client, alice_keypair):
    default_of(ResourcePolicy)
    _, body = gql(client, alice_keypair, "{ keypair_resource_policy { name } }")
    assert body["data"]["keypair_resource_policy"] == {"name": "default"}
