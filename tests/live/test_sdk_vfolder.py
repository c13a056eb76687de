"""Every function of the 26.9.6 SDK's VFolder class, called by tests/live/sdk_vfolder.py in
the client's own Python against a real web server: each works, or answers Backend.AI's
"not implemented" error saying why (docs/backendai-compatibility.md, "Backend.AI SDK functions")."""

import json
import os
from pathlib import Path

import pytest

from identity_app.keypairs import main_keypair
from identity_app.models import Project
from scheduling_app.models import ScalingGroup
from storage_app.models import Folder, FolderGrant

SCRIPT = Path(__file__).with_name("sdk_vfolder.py")
NOT_IMPLEMENTED = "https://api.backend.ai/probs/not-implemented"


@pytest.fixture
def sdk(client_forkservers, web_server, tmp_path):
    def run(user, *args):
        keypair = main_keypair(user)
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8",
               "BACKEND_ENDPOINT": web_server.url, "BACKEND_ENDPOINT_TYPE": "api",
               "BACKEND_ACCESS_KEY": keypair.access_key,
               "BACKEND_SECRET_KEY": keypair.secret_key, "SDK_WORKDIR": str(tmp_path)}
        done = client_forkservers.python("26.9.6", [SCRIPT, *args], env, timeout=300,
                                         tmp_path=tmp_path)
        calls = {}
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                calls[entry["fn"]] = entry
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return calls
    return run


def ok(calls, *names):
    for name in names:
        assert "result" in calls.get(name, {}), (name, calls.get(name))


@pytest.mark.django_db(transaction=True)
def test_every_vfolder_function_of_the_newest_sdk(sdk, alice, bob, carol, tmp_path):
    root = tmp_path / "storage"
    ScalingGroup.objects.filter(name="default").update(storage_root=str(root))
    Project.objects.get(name="default").members.add(bob)

    calls = sdk(alice, "owner", "svf", "bob@example.com", str(tmp_path))
    ok(calls, "create", "list", "get_id", "list_hosts", "list_allowed_types", "info",
       "mkdir", "upload", "upload_dst_dir", "upload_recursive", "list_files", "rename_file",
       "move_file", "download", "delete_files", "paginated_list", "paginated_own_list",
       "invite", "list_shared_vfolders")
    folder = root / Folder.objects.get(name="svf").pk.hex
    assert (folder / "hello.txt").read_text() == "hello from the sdk\n"
    assert (folder / "sub" / "nested.txt").read_text() == "nested\n"
    assert not (folder / "docs" / "a").exists()  # moved into, then deleted
    assert (tmp_path / "down" / "hello.txt").read_text() == "hello from the sdk\n"
    assert calls["invite"]["result"] == {"invited_ids": ["bob@example.com"]}
    assert calls["paginated_own_list"]["result"]["total_count"] == 1

    calls = sdk(bob, "invitee", "svf", str(tmp_path))
    ok(calls, "invitations", "accept_invitation", "paginated_invited_list", "info",
       "list_files", "download", "shared_vfolder_info", "leave")
    assert calls["info"]["result"]["permission"] == "ro"
    assert (tmp_path / "invitee" / "hello.txt").exists()
    assert calls["upload"]["error"]["status"] == 403  # read-only for bob
    assert calls["shared_vfolder_info"]["result"]["shared"][0]["perm"] == "ro"
    assert calls["info_after_leave"]["error"]["status"] == 404
    assert not FolderGrant.objects.exists()

    calls = sdk(carol, "admin", "team", "bob@example.com")
    ok(calls, "create_project_folder", "paginated_project_list", "share", "list_all_hosts",
       "list_shared_vfolders", "update_shared_vfolder", "unshare", "update_options",
       "create_gift", "change_vfolder_ownership")
    assert calls["share"]["result"] == {"shared_emails": ["bob@example.com"]}
    assert Folder.objects.get(name="team").member_permission == "rw"
    assert Folder.objects.get(name="team-gift").user == bob

    calls = sdk(alice, "unsupported", "svf")
    for name in ("purge", "recover", "restore", "delete_trash", "clone",
                 "get_fstab_contents", "get_performance_metric", "list_mounts",
                 "mount_host", "umount_host"):
        error = calls[name]["error"]
        assert error["status"] == 501 and error["type"] == NOT_IMPLEMENTED, (name, error)
        assert len(error["msg"]) > 40, error  # says why

    calls = sdk(alice, "finish", "svf")
    ok(calls, "rename", "delete", "create_again", "delete_by_id", "create_third",
       "force_delete")
    assert not Folder.objects.filter(user=alice).exists()
