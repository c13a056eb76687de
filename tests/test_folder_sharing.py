"""Folders shared with other users through Backend.AI's routes: invitations to a user's
folder, shares of a project folder, and what each permission lets the other user do
(files, transfers, mounts)."""

import pytest

from identity_app.keypairs import main_keypair
from storage_app.models import Folder, FolderGrant, FolderInvitation
from tests.conftest import make_user
from tests.signing import signed_call


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.STORAGE_ROOT = tmp_path / "storage"
    return settings.STORAGE_ROOT


@pytest.fixture
def call(client):
    def call(user, method, path, body=None):
        return signed_call(client, main_keypair(user), method, path, body)
    return call


@pytest.fixture
def dave(defaults, django_user_model):
    return make_user(django_user_model, "dave")


def invite(call, owner, folder, perm, *emails):
    return call(owner, "POST", f"/folders/{folder}/invite", {"perm": perm, "user_ids": emails})


def accept_all(call, user):
    invitations = call(user, "GET", "/folders/invitations/list").json()["invitations"]
    for invitation in invitations:
        assert call(user, "POST", "/folders/invitations/accept",
                    {"inv_id": invitation["id"]}).status_code == 200
    return invitations


def test_an_invited_user_reads_a_read_only_folder_and_writes_nothing(call, alice, bob):
    assert call(alice, "POST", "/folders", {"name": "vf"}).status_code == 201
    call(alice, "POST", "/folders/vf/mkdir", {"path": "inside"})
    assert call(bob, "GET", "/folders/vf").status_code == 404  # not shared yet
    sent = invite(call, alice, "vf", "ro", "bob@example.com")
    assert sent.status_code == 201 and sent.json() == {"invited_ids": ["bob@example.com"]}
    invitations = accept_all(call, bob)
    assert [(i["inviter"], i["invitee"], i["perm"], i["vfolder_name"], i["state"])
            for i in invitations] == [("alice@example.com", "bob@example.com", "ro", "vf",
                                       "pending")]
    assert call(bob, "GET", "/folders/invitations/list").json() == {"invitations": []}
    info = call(bob, "GET", "/folders/vf").json()
    assert (info["is_owner"], info["permission"], info["type"]) == (False, "ro", "user")
    assert [f["name"] for f in call(bob, "GET", "/folders").json()] == ["vf"]
    assert [i["name"] for i in call(bob, "GET", "/folders/vf/files",
                                    {"path": "."}).json()["items"]] == ["inside"]
    assert call(bob, "POST", "/folders/vf/request-download", {"path": "f"}).status_code == 200
    for method, path, body in (
            ("POST", "/folders/vf/mkdir", {"path": "mine"}),
            ("POST", "/folders/vf/request-upload", {"path": "f", "size": 1}),
            ("DELETE", "/folders/vf/delete-files", {"files": ["inside"], "recursive": True}),
            ("DELETE", "/folders/vf", None),  # deleting the folder is its owner's
            ("POST", "/folders/vf/invite", {"perm": "rw", "user_ids": ["carol@example.com"]}),
    ):
        assert call(bob, method, path, body).status_code == 403, path
    # A session of bob's mounts it read-only (asked rw: refused).
    rw = call(bob, "POST", "/api/v1/sessions/", {
        "name": "s", "image": "i", "mounts": [{"name": "vf", "mode": "rw"}]})
    assert rw.status_code == 403
    ro = call(bob, "POST", "/api/v1/sessions/", {"name": "s", "image": "i", "mounts": ["vf"]})
    assert ro.status_code == 201 and ro.json()["mounts"][0]["mode"] == "ro"
    assert call(bob, "POST", "/folders/vf/leave", {"shared_user_uuid": None}).json() == {
        "msg": "left the shared vfolder"}
    assert call(bob, "GET", "/folders/vf").status_code == 404
    assert call(alice, "POST", "/folders/vf/leave", {}).status_code == 400  # the owner


def test_a_read_write_invitee_writes_and_the_owner_sees_who_shares(call, alice, bob, dave):
    created = call(alice, "POST", "/folders", {"name": "vf"}).json()
    invite(call, alice, "vf", "rw", "bob@example.com")
    accept_all(call, bob)
    assert call(bob, "POST", "/folders/vf/mkdir", {"path": "from-bob"}).status_code == 201
    shared = call(alice, "GET", "/folders/_/shared").json()["shared"]
    assert [(s["vfolder_name"], s["shared_to"]["email"], s["perm"], s["type"])
            for s in shared] == [("vf", "bob@example.com", "rw", "user")]
    assert call(bob, "GET", "/folders/_/shared").json()["shared"] == shared
    assert call(dave, "GET", "/folders/_/shared").json() == {"shared": []}
    one = call(alice, "GET", f"/folders/_/shared?vfolder_id={created['id']}").json()
    assert len(one["shared"]) == 1
    # The owner lowers bob's permission, then takes it back.
    assert call(alice, "POST", "/folders/_/shared", {
        "vfolder": created["id"], "user": shared[0]["shared_to"]["uuid"], "perm": "ro",
    }).status_code == 200
    assert call(bob, "POST", "/folders/vf/mkdir", {"path": "again"}).status_code == 403
    assert call(bob, "POST", "/folders/_/shared", {
        "vfolder": created["id"], "user": str(bob.pk), "perm": "rw"}).status_code == 403
    assert call(alice, "POST", "/folders/_/shared", {
        "vfolder": created["id"], "user": "bob@example.com", "perm": None}).status_code == 200
    assert call(bob, "GET", "/folders/vf").status_code == 404


def test_invitations_refused_repeated_rejected_and_cancelled(call, alice, bob, dave):
    call(alice, "POST", "/folders", {"name": "vf"})
    unknown = invite(call, alice, "vf", "rw", "nobody@example.com")
    assert unknown.status_code == 404 and "nobody@example.com" in unknown.json()["msg"]
    assert invite(call, alice, "vf", "rw", "alice@example.com").status_code == 400
    assert invite(call, alice, "vf", "rx", "bob@example.com").status_code == 400
    assert invite(call, alice, "vf", "rw", "bob@example.com").json()["invited_ids"] == [
        "bob@example.com"]
    again = invite(call, alice, "vf", "rw", "bob@example.com", "dave")  # a user name works
    assert again.json()["invited_ids"] == ["dave@example.com"]  # bob's is still pending
    mine = call(bob, "GET", "/folders/invitations/list").json()["invitations"][0]
    # Nobody else answers bob's invitation; its inviter may cancel it.
    assert call(dave, "POST", "/folders/invitations/accept",
                {"inv_id": mine["id"]}).status_code == 404
    assert call(dave, "DELETE", "/folders/invitations/delete",
                {"inv_id": mine["id"]}).status_code == 404
    assert call(bob, "POST", "/folders/invitations/delete",
                {"inv_id": mine["id"]}).status_code == 200
    assert FolderInvitation.objects.get(pk=mine["id"]).state == "rejected"
    daves = call(dave, "GET", "/folders/invitations/list").json()["invitations"][0]
    assert call(alice, "GET", "/folders/invitations/list-sent").json()["invitations"][0][
        "id"] == daves["id"]
    assert call(alice, "DELETE", "/folders/invitations/delete",
                {"inv_id": daves["id"]}).status_code == 200
    assert FolderInvitation.objects.get(pk=daves["id"]).state == "canceled"
    assert call(dave, "POST", "/folders/invitations/accept",
                {"inv_id": daves["id"]}).status_code == 404
    assert call(dave, "POST", "/folders/invitations/accept",
                {"inv_id": "not-an-id"}).status_code == 404
    # Accepted, then invited again: already shared.
    invite(call, alice, "vf", "ro", "bob@example.com")
    accept_all(call, bob)
    assert invite(call, alice, "vf", "ro", "bob@example.com").status_code == 409


def test_accepting_a_folder_whose_name_the_invitee_has_is_refused(call, alice, bob):
    call(alice, "POST", "/folders", {"name": "data"})
    call(bob, "POST", "/folders", {"name": "data"})
    invite(call, alice, "data", "rw", "bob@example.com")
    inv = call(bob, "GET", "/folders/invitations/list").json()["invitations"][0]
    refused = call(bob, "POST", "/folders/invitations/accept", {"inv_id": inv["id"]})
    assert refused.status_code == 409 and "rename yours" in refused.json()["msg"]
    assert call(bob, "POST", "/folders/data/rename", {"new_name": "mine"}).status_code == 200
    assert call(bob, "POST", "/folders/invitations/accept",
                {"inv_id": inv["id"]}).status_code == 200
    assert sorted(f["name"] for f in call(bob, "GET", "/folders").json()) == ["data", "mine"]
    # Renaming is the owner's: bob may not rename alice's folder.
    assert call(bob, "POST", "/folders/data/rename", {"new_name": "x"}).status_code == 403


def test_an_admin_shares_a_project_folder_with_chosen_members(call, client, carol, bob, dave,
                                                              defaults):
    client.force_login(carol)
    made = client.post("/api/v1/folders/", {"name": "team", "project": "default",
                                            "member_permission": "ro"},
                       content_type="application/json")
    assert made.status_code == 201
    defaults.members.add(bob)
    assert call(bob, "POST", "/folders/team/mkdir", {"path": "x"}).status_code == 403
    assert call(bob, "POST", "/folders/team/share", {
        "permission": "rw", "emails": ["bob@example.com"]}).status_code == 403  # not admin
    outsider = call(carol, "POST", "/folders/team/share",
                    {"permission": "rw", "emails": ["dave@example.com"]})
    assert outsider.status_code == 404 and "Not members" in outsider.json()["msg"]
    shared = call(carol, "POST", "/folders/team/share",
                  {"permission": "rw", "emails": ["bob@example.com"]})
    assert shared.status_code == 201 and shared.json() == {"shared_emails": ["bob@example.com"]}
    assert call(bob, "GET", "/folders/team").json()["permission"] == "rw"
    assert call(bob, "POST", "/folders/team/mkdir", {"path": "x"}).status_code == 201
    assert call(bob, "POST", "/folders/team/leave", {}).status_code == 400  # a project's
    unshared = call(carol, "DELETE", "/folders/team/unshare", {"emails": ["bob@example.com"]})
    assert unshared.json() == {"unshared_emails": ["bob@example.com"]}
    assert call(bob, "POST", "/folders/team/mkdir", {"path": "y"}).status_code == 403
    # A user's folder is shared by invitation, not by share.
    call(carol, "POST", "/folders", {"name": "own"})
    assert call(carol, "POST", "/folders/own/share",
                {"emails": ["bob@example.com"]}).status_code == 400
    # The members' permission itself, from update-options.
    assert call(carol, "POST", "/folders/team/update-options",
                {"permission": "rw"}).status_code == 200
    assert Folder.objects.get(name="team").member_permission == "rw"


def test_a_superuser_gives_a_folder_to_another_user(call, carol, alice, bob):
    created = call(alice, "POST", "/folders", {"name": "vf"}).json()
    invite(call, alice, "vf", "rw", "bob@example.com")
    accept_all(call, bob)
    assert call(alice, "POST", "/folders/_/change-ownership", {
        "vfolder": created["id"], "user_email": "bob@example.com"}).status_code == 403
    assert call(carol, "POST", "/folders/_/change-ownership", {
        "vfolder": created["id"], "user_email": "bob@example.com"}).status_code == 200
    assert Folder.objects.get(pk=created["id"]).user == bob
    assert not FolderGrant.objects.exists()  # bob owns it now
    assert call(bob, "GET", "/folders/vf").json()["is_owner"] is True
    assert call(alice, "GET", "/folders/vf").status_code == 404


def test_hosts_and_types(call, alice, carol):
    hosts = call(alice, "GET", "/folders/_/hosts").json()
    assert hosts["default"] == "default" and hosts["allowed"] == ["default"]
    assert call(alice, "GET", "/folders/_/all_hosts").status_code == 403
    assert call(carol, "GET", "/folders/_/all_hosts").json() == {
        "default": "default", "allowed": ["default"]}
    assert call(alice, "GET", "/folders/_/allowed_types").json() == ["user", "group"]


def test_the_admin_lists_folders_invitations_and_grants(call, client, carol, alice, bob):
    created = call(alice, "POST", "/folders", {"name": "vf"}).json()
    invite(call, alice, "vf", "ro", "bob@example.com")
    accept_all(call, bob)
    client.force_login(carol)
    for page in ("/admin/storage_app/folder/",
                 f"/admin/storage_app/folder/{created['id']}/change/",
                 "/admin/storage_app/folderinvitation/", "/admin/storage_app/foldergrant/"):
        response = client.get(page)
        assert response.status_code == 200, page
        assert b"bob" in response.content or b"vf" in response.content


# The query the SDK's paginated lists send (ai.backend.client.pagination), with the
# default fields of VFolder.paginated_*_list.
FOLDER_PAGE = """
query($limit:Int!, $offset:Int!, $filter: String, $order: String) {
  ROOT(
      limit:$limit, offset:$offset, filter:$filter, order:$order) {
    items { host name status created_at creator group permission ownership_type }
    total_count
  }
}"""


def folder_page(call, user, root, **variables):
    response = call(user, "POST", "/admin/gql", {
        "query": FOLDER_PAGE.replace("ROOT", root),
        "variables": {"limit": 20, "offset": 0, "filter": None, "order": None, **variables}})
    assert response.status_code == 200, response.content
    body = response.json()
    assert "errors" not in body, body
    return body["data"][root]


def test_the_graphql_folder_lists_the_sdk_pages_through(call, client, carol, alice, bob,
                                                        defaults):
    call(alice, "POST", "/folders", {"name": "mine"})
    call(bob, "POST", "/folders", {"name": "bobs"})
    invite(call, bob, "bobs", "ro", "alice@example.com")
    accept_all(call, alice)
    client.force_login(carol)
    client.post("/api/v1/folders/", {"name": "team", "project": "default"},
                content_type="application/json")
    defaults.members.add(alice)

    def names(root, **variables):
        page = folder_page(call, alice, root, **variables)
        assert page["total_count"] == len(page["items"])
        return [(i["name"], i["permission"], i["ownership_type"]) for i in page["items"]]

    assert names("vfolder_list") == [("bobs", "ro", "user"), ("mine", "rw", "user"),
                                     ("team", "rw", "group")]
    assert names("vfolder_list", order="-name")[0][0] == "team"
    assert names("vfolder_own_list") == [("mine", "rw", "user")]
    assert names("vfolder_invited_list") == [("bobs", "ro", "user")]
    assert names("vfolder_project_list") == [("team", "rw", "group")]
    item = folder_page(call, alice, "vfolder_own_list")["items"][0]
    assert item["creator"] == "alice@example.com" and item["status"] == "ready"
    refused = call(alice, "POST", "/admin/gql", {
        "query": FOLDER_PAGE.replace("ROOT", "vfolder_list"),
        "variables": {"limit": 20, "offset": 0, "filter": 'name == "x"', "order": None}})
    assert "not supported" in refused.json()["errors"][0]["message"]


def test_the_dashboard_shows_a_folder_shared_read_only(call, alice, bob, storage):
    from django.test import Client

    folder_id = Folder.objects.get(pk=call(alice, "POST", "/folders",
                                           {"name": "vf"}).json()["id"]).pk
    invite(call, alice, "vf", "ro", "bob@example.com")
    accept_all(call, bob)
    browser = Client()
    browser.force_login(bob)
    assert b"vf" in browser.get("/folders/").content
    page = browser.get(f"/folders/{folder_id}/")
    assert page.status_code == 200 and b"read-only for you" in page.content
    refused = browser.post(f"/folders/{folder_id}/delete/", follow=True)
    assert b"Only the owner of" in refused.content
    assert Folder.objects.filter(pk=folder_id).exists()
