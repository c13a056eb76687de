"""Backend.AI's routes for sharing folders (the SDK's VFolder.invite, invitations,
accept_invitation, delete_invitation, leave, share, unshare, list_shared_vfolders,
shared_vfolder_info, update_shared_vfolder, change_vfolder_ownership; the CLI's `vfolder
invite / invitations / share / unshare / leave`), over storage_app.sharing."""

from django.contrib.auth import get_user_model
from rest_framework import status
from rest_framework.response import Response

from identity_app.api.permissions import request_is_admin, request_is_superadmin
from storage_app import sharing
from storage_app.api.views import FolderRequestFailed, file_errors
from storage_app.compat.views import FolderView, argument

GRANT_STATUS = "ready"  # Backend.AI's folder status; folders here have no other


def invitation_json(invitation):
    return {"id": str(invitation.pk), "inviter": sharing.email_of(invitation.inviter),
            "invitee": sharing.email_of(invitation.invitee), "perm": invitation.permission,
            "state": invitation.state, "created_at": invitation.created_at.isoformat(),
            "modified_at": invitation.modified_at.isoformat(),
            "vfolder_id": str(invitation.folder_id), "vfolder_name": invitation.folder.name}


def shared_json(grant):
    folder = grant.folder
    return {"vfolder_id": str(folder.pk), "vfolder_name": folder.name,
            "status": GRANT_STATUS,
            "owner": str(folder.project_id if folder.project_id else folder.user_id),
            "type": "project" if folder.project_id else "user",
            "shared_to": {"uuid": str(grant.user_id), "email": sharing.email_of(grant.user)},
            "perm": grant.permission}


def one_user(ref):
    """A user by id (as the shared list gives it) or email."""
    users = get_user_model().objects.filter(is_active=True)
    if isinstance(ref, str) and ref.isdigit():
        user = users.filter(pk=int(ref)).first()
        if user is not None:
            return user
    return sharing.users_named([ref])[0]


class Invite(FolderView):
    """POST /folders/NAME/invite {"perm", "user_ids"|"emails"}: 201 {"invited_ids": emails}."""

    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name)
        emails = argument(request, "user_ids") or argument(request, "emails")
        permission = argument(request, "perm") or argument(request, "permission") or "rw"
        invited = sharing.invite(folder, request.user, emails, permission)
        return Response({"invited_ids": invited}, status=status.HTTP_201_CREATED)


class Invitations(FolderView):
    """GET /folders/invitations/list: the caller's pending invitations."""

    def get(self, request):
        return Response({"invitations": [invitation_json(i)
                                         for i in sharing.pending_for(request.user)]})


class SentInvitations(FolderView):
    """GET /folders/invitations/list-sent: the pending invitations the caller sent."""

    def get(self, request):
        return Response({"invitations": [invitation_json(i)
                                         for i in sharing.sent_by(request.user)]})


class AcceptInvitation(FolderView):
    @file_errors
    def post(self, request):
        sharing.accept(argument(request, "inv_id"), request.user)
        return Response({"msg": ""})


class DeleteInvitation(FolderView):
    """The invitee rejects, the inviter cancels (POST or DELETE, as the clients send)."""

    @file_errors
    def post(self, request):
        sharing.decline(argument(request, "inv_id"), request.user)
        return Response({"msg": ""})

    delete = post


class Leave(FolderView):
    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name)
        other = argument(request, "shared_user_uuid")
        sharing.leave(folder, request.user, on_behalf_of=one_user(other) if other else None,
                      superuser=request_is_superadmin(request))
        return Response({"msg": "left the shared vfolder"})


class Share(FolderView):
    """Administrators: POST /folders/NAME/share {"permission", "emails"} (a project
    folder); 201 {"shared_emails"}."""

    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name)
        if not request_is_admin(request):
            raise FolderRequestFailed("Only administrators share project folders.", 403)
        shared = sharing.share(folder, argument(request, "emails"),
                               argument(request, "permission") or "rw")
        return Response({"shared_emails": shared}, status=status.HTTP_201_CREATED)


class Unshare(FolderView):
    @file_errors
    def post(self, request, name):
        folder = self.folder(request, name)
        if not request_is_admin(request):
            raise FolderRequestFailed("Only administrators unshare project folders.", 403)
        return Response({"unshared_emails": sharing.unshare(folder,
                                                            argument(request, "emails"))})

    delete = post


class Shared(FolderView):
    """GET /folders/_/shared [?vfolder_id=]: who a folder is shared with (the folders you
    own, and your own shares; admins: all). POST {"vfolder", "user", "perm"}: change a
    user's permission on a folder you own (perm null: take it back)."""

    @file_errors
    def get(self, request):
        admin = request_is_admin(request)
        folder = None
        ref = argument(request, "vfolder_id")
        if ref:
            folder = self.folder(request, ref)
        grants = sharing.grants_visible_to(request.user, admin=admin, folder=folder)
        return Response({"shared": [shared_json(g) for g in grants]})

    @file_errors
    def post(self, request):
        folder = self.folder(request, str(argument(request, "vfolder") or ""))
        if not (request_is_admin(request) or folder.user_id == request.user.pk):
            raise FolderRequestFailed(f"Only the owner of {folder.name!r} changes who it is "
                                      "shared with.", 403)
        sharing.set_grant(folder, one_user(argument(request, "user")),
                          argument(request, "perm") or argument(request, "permission"))
        return Response({"msg": "shared vfolder permission updated"})


class ChangeOwnership(FolderView):
    """Superusers: POST /folders/_/change-ownership {"vfolder", "user_email"}."""

    @file_errors
    def post(self, request):
        if not request_is_superadmin(request):
            raise FolderRequestFailed("Only superusers change a folder's owner.", 403)
        folder = self.folder(request, str(argument(request, "vfolder") or ""))
        sharing.change_owner(folder, sharing.users_named([argument(request, "user_email")])[0])
        return Response({"msg": ""})
