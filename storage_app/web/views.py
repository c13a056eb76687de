"""The dashboard's Folders page and folder browser. The browser's file operations go to
/api/v1/folders/ from static/js/folders.js (uploads in resumable parts with a progress
bar); these views render the pages and take the folder forms."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from identity_app.acting import actor_of
from storage_app import folders as domain


def viewer(request):
    actor = actor_of(request)
    return actor.keypair, actor.is_admin


def found(request, ref):
    _, admin = viewer(request)
    folder = domain.find_folder(request.user, ref, admin=admin)
    if folder is None:  # another user's folder is not there
        raise Http404("Folder not found.")
    return folder


@login_required
def folder_list(request):
    keypair, admin = viewer(request)
    rows = []
    for folder in domain.visible_folders(request.user).order_by("name"):
        used = domain.usage(folder)
        percent = min(100, round(100 * used / folder.quota)) if folder.quota else None
        rows.append({"folder": folder, "usage": used, "percent": percent,
                     "mounted_by": list(domain.sessions_mounting(folder)
                                        .values_list("name", flat=True))})
    policy = keypair.resource_policy
    return render(request, "storage/folder_list.html", {
        "rows": rows, "admin": admin, "policy": policy,
        "owned": sum(1 for r in rows if r["folder"].user_id == request.user.pk)})


@login_required
@require_POST
def folder_create(request):
    keypair, _ = viewer(request)
    try:
        folder = domain.create_folder(user=request.user, name=request.POST.get("name", ""),
                                      policy=keypair.resource_policy)
    except domain.FolderError as exc:
        messages.error(request, exc.message)
        return redirect("folders:list")
    messages.success(request, f"Folder {folder.name} created.")
    return redirect("folders:detail", ref=folder.pk)


@login_required
@require_POST
def folder_delete(request, ref):
    folder = found(request, ref)
    _, admin = viewer(request)
    if not domain.may_delete(folder, request.user, admin=admin):
        messages.error(request, domain.delete_refusal(folder))
        return redirect("folders:list")
    try:
        domain.delete_folder(folder)
    except domain.FolderError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Folder {folder.name} deleted with its files.")
    return redirect("folders:list")


@login_required
def folder_detail(request, ref):
    folder = found(request, ref)
    _, admin = viewer(request)
    return render(request, "storage/folder_detail.html", {
        "folder": folder, "admin": admin, "usage": domain.usage(folder),
        "writable": domain.may_write(folder, request.user, admin=admin),
        "mounted_by": list(domain.sessions_mounting(folder).values_list("name", flat=True))})
