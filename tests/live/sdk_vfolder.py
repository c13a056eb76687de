"""Run by the 26.9.6 client's own Python (tests/live/test_sdk_vfolder.py), with BACKEND_*
in the environment: every function of the SDK's VFolder class as a script calls it. Prints
one JSON object per call: {"fn", "result"} or {"fn", "error": {"status", "type", "title",
"msg"}}; the test reads them.

    python sdk_vfolder.py owner NAME INVITEE WORKDIR     a folder's owner, start to end
    python sdk_vfolder.py invitee NAME WORKDIR           the invited user's side
    python sdk_vfolder.py admin PROJECT_FOLDER MEMBER    a superuser's functions
    python sdk_vfolder.py unsupported NAME               the functions not served here
    python sdk_vfolder.py finish NAME                    the owner's last calls
"""

import asyncio
import json
import os
import sys
from pathlib import Path

from ai.backend.client.exceptions import BackendAPIError, BackendError
from ai.backend.client.session import AsyncSession


def say(**fields):
    print(json.dumps(fields, default=str), flush=True)


async def call(fn, awaitable):
    try:
        result = await awaitable
    except BackendAPIError as exc:
        data = exc.data if isinstance(exc.data, dict) else {"msg": str(exc.data)}
        say(fn=fn, error={"status": exc.status, "type": data.get("type"),
                          "title": data.get("title"), "msg": data.get("msg")})
        return None
    except BackendError as exc:
        say(fn=fn, error={"status": None, "msg": str(exc)})
        return None
    say(fn=fn, result=result if not hasattr(result, "items") or isinstance(result, dict)
        else {"total_count": result.total_count, "items": result.items})
    return result


async def owner(api, name, invitee, workdir):
    work = Path(workdir)
    (work / "up" / "sub").mkdir(parents=True, exist_ok=True)
    (work / "up" / "hello.txt").write_text("hello from the sdk\n")
    (work / "up" / "sub" / "nested.txt").write_text("nested\n")
    VFolder = api.VFolder
    await call("create", VFolder.create(name, host="default"))
    await call("list", VFolder.list())
    await call("get_id", VFolder(name).get_id())
    await call("list_hosts", VFolder.list_hosts())
    await call("list_allowed_types", VFolder.list_allowed_types())
    await call("info", VFolder(name).info())
    await call("mkdir", VFolder(name).mkdir(["docs", "docs/a"], parents=True))
    await call("upload", VFolder(name).upload(["hello.txt"], basedir=work / "up"))
    await call("upload_dst_dir", VFolder(name).upload(["hello.txt"], basedir=work / "up",
                                                      dst_dir="docs"))
    await call("upload_recursive", VFolder(name).upload(["sub"], basedir=work / "up",
                                                        recursive=True))
    await call("list_files", VFolder(name).list_files("."))
    await call("rename_file", VFolder(name).rename_file("docs/hello.txt", "renamed.txt"))
    await call("move_file", VFolder(name).move_file("docs/renamed.txt", "docs/a/moved.txt"))
    (work / "down").mkdir(exist_ok=True)
    await call("download", VFolder(name).download(["hello.txt"], basedir=work / "down"))
    await call("delete_files", VFolder(name).delete_files(["docs/a"], recursive=True))
    await call("paginated_list", VFolder.paginated_list())
    await call("paginated_own_list", VFolder.paginated_own_list())
    await call("invite", VFolder(name).invite("ro", [invitee]))
    await call("list_shared_vfolders", VFolder.list_shared_vfolders())


async def invitee(api, name, workdir):
    work = Path(workdir)
    VFolder = api.VFolder
    invitations = await call("invitations", VFolder.invitations())
    for invitation in (invitations or {}).get("invitations", []):
        if invitation["vfolder_name"] == name:
            await call("accept_invitation", VFolder.accept_invitation(invitation["id"]))
    await call("paginated_invited_list", VFolder.paginated_invited_list())
    await call("info", VFolder(name).info())
    await call("list_files", VFolder(name).list_files("."))
    (work / "invitee").mkdir(exist_ok=True)
    await call("download", VFolder(name).download(["hello.txt"], basedir=work / "invitee"))
    (work / "invitee" / "mine.txt").write_text("x")
    await call("upload", VFolder(name).upload(["mine.txt"], basedir=work / "invitee"))
    await call("shared_vfolder_info", VFolder.shared_vfolder_info(
        str(await VFolder(name).get_id())))
    await call("leave", VFolder(name).leave())
    await call("info_after_leave", VFolder(name).info())


async def admin(api, project_folder, member):
    VFolder = api.VFolder
    await call("create_project_folder", VFolder.create(
        project_folder, host="default", group="default", permission="ro"))
    await call("paginated_project_list", VFolder.paginated_project_list())
    await call("share", VFolder(project_folder).share("rw", [member]))
    await call("list_all_hosts", VFolder.list_all_hosts())
    shared = await call("list_shared_vfolders", VFolder.list_shared_vfolders())
    for entry in (shared or {}).get("shared", []):
        if entry["vfolder_name"] == project_folder:
            await call("update_shared_vfolder", VFolder.update_shared_vfolder(
                entry["vfolder_id"], entry["shared_to"]["uuid"], "ro"))
    await call("unshare", VFolder(project_folder).unshare([member]))
    await call("update_options", VFolder(project_folder).update_options(
        project_folder, permission="rw"))
    gift = await call("create_gift", VFolder.create(project_folder + "-gift", host="default"))
    await call("change_vfolder_ownership", VFolder.change_vfolder_ownership(
        (gift or {}).get("id", ""), member))


async def unsupported(api, name):
    VFolder = api.VFolder
    for fn, awaitable in (
            ("purge", VFolder(name).purge()), ("recover", VFolder(name).recover()),
            ("restore", VFolder(name).restore()),
            ("delete_trash", VFolder(name).delete_trash()),
            ("clone", VFolder(name).clone(name + "-copy")),
            ("get_fstab_contents", VFolder.get_fstab_contents()),
            ("get_performance_metric", VFolder.get_performance_metric("default")),
            ("list_mounts", VFolder.list_mounts()),
            ("mount_host", VFolder.mount_host("n", "nfs-host:/export")),
            ("umount_host", VFolder.umount_host("n"))):
        await call(fn, awaitable)


async def finish(api, name):
    VFolder = api.VFolder
    await call("rename", VFolder(name).rename(name + "-renamed"))
    await call("delete", VFolder(name + "-renamed").delete())
    made = await call("create_again", VFolder.create(name + "-2", host="default"))
    await call("delete_by_id", VFolder.delete_by_id((made or {}).get("id", "")))
    made = await call("create_third", VFolder.create(name + "-3", host="default"))
    await call("force_delete", VFolder(name + "-3").force_delete())


async def main(action, *args):
    os.chdir(os.environ.get("SDK_WORKDIR", "."))
    async with AsyncSession() as api:
        await {"owner": owner, "invitee": invitee, "admin": admin,
               "unsupported": unsupported, "finish": finish}[action](api, *args)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
