"""Folders shared with other users, as Backend.AI shares vfolders.

- A user's folder: its owner invites other users (by email, or user name); an invitee
  accepts (a FolderGrant with the invitation's permission) or rejects, the owner may
  cancel; an invitee with a grant may leave, the owner may take a grant back.
- A project folder: its members use it with the folder's member permission; an
  administrator may share it with chosen members at another permission (a FolderGrant
  that overrides it for them) and unshare it again.

Who may see and use a folder follows from these rows (storage_app.folders.access_of),
for the files routes, the transfers and the mounts alike. A grant taken back does not
unmount the folder from sessions that already run, as in Backend.AI.
"""

import uuid

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q

from storage_app.folders import NAME_PATTERN, FolderError
from storage_app.models import Folder, FolderGrant, FolderInvitation, GrantPermission

State = FolderInvitation.State


def email_of(user):
    return user.email or user.get_username()


def check_permission(permission):
    if permission not in GrantPermission.values:
        raise FolderError(f"A permission is one of {', '.join(GrantPermission.values)}, not "
                          f"{permission!r}.", field="perm")
    return permission


def users_named(refs):
    """The users that `refs` name (emails, case-insensitive, or user names), in order;
    a 404 naming those that name nobody."""
    if isinstance(refs, str):
        refs = [refs]
    if not isinstance(refs, list | tuple) or not refs \
            or not all(isinstance(r, str) and r for r in refs):
        raise FolderError("Name the users by their emails, as a non-empty list.",
                          field="emails")
    found, unknown = [], []
    users = get_user_model().objects.filter(is_active=True)
    for ref in refs:
        user = (users.filter(email__iexact=ref).order_by("pk").first()
                or users.filter(username=ref).first())
        if user is None:
            unknown.append(ref)
        elif user not in found:
            found.append(user)
    if unknown:
        raise FolderError(f"There is no user {', '.join(map(repr, unknown))}.", 404,
                          "emails")
    return found


def name_taken(user, name):
    """Whether `user` already reaches a folder called `name` by name: their own, or one
    shared with them (the SDK and mounts name folders by name)."""
    return Folder.objects.filter(Q(user=user) | Q(user__isnull=False, grants__user=user),
                                 name=name).exists()


def invite(folder, inviter, refs, permission):
    """Invite users to `inviter`'s own folder; the emails of those invited now (a user
    with a pending invitation already is left as invited)."""
    if folder.project_id is not None:
        raise FolderError("A project folder is used by the project's members; an "
                          "administrator shares it with chosen members (share), it is not "
                          "invited to.")
    if folder.user_id != inviter.pk:
        raise FolderError(f"Only the owner of {folder.name!r} invites users to it.", 403)
    check_permission(permission)
    invitees = users_named(refs)
    if inviter in invitees:
        raise FolderError("You own this folder already.", field="emails")
    shared = FolderGrant.objects.filter(folder=folder, user__in=invitees)
    if shared.exists():
        names = sorted(email_of(g.user) for g in shared.select_related("user"))
        raise FolderError(f"The folder {folder.name!r} is shared with {', '.join(names)} "
                          "already.", 409, "emails")
    invited = []
    with transaction.atomic():
        pending = set(FolderInvitation.objects.select_for_update().filter(
            folder=folder, state=State.PENDING).values_list("invitee_id", flat=True))
        for invitee in invitees:
            if invitee.pk not in pending:
                FolderInvitation.objects.create(folder=folder, inviter=inviter,
                                                invitee=invitee, permission=permission)
                invited.append(email_of(invitee))
    return invited


def pending_for(user):
    return (FolderInvitation.objects.filter(invitee=user, state=State.PENDING)
            .select_related("folder", "inviter", "invitee"))


def sent_by(user):
    return (FolderInvitation.objects.filter(inviter=user, state=State.PENDING)
            .select_related("folder", "inviter", "invitee"))


def _pending(invitation_id, user, *roles):
    """The pending invitation `invitation_id` that `user` is the invitee (or inviter) of,
    locked; another user's invitation is no such invitation."""
    mine = Q()
    for role in roles:
        mine |= Q(**{role: user})
    try:
        key = uuid.UUID(str(invitation_id))
        return FolderInvitation.objects.select_for_update().select_related("folder").get(
            mine, pk=key, state=State.PENDING)
    except (ValueError, FolderInvitation.DoesNotExist):
        raise FolderError(f"There is no pending invitation {invitation_id!r} for you.",
                          404) from None


def accept(invitation_id, user):
    """The invitee takes the folder: a grant with the invitation's permission."""
    with transaction.atomic():
        invitation = _pending(invitation_id, user, "invitee")
        if name_taken(user, invitation.folder.name):
            raise FolderError(f"You have a folder named {invitation.folder.name!r} already; "
                              "rename yours first.", 409)
        FolderGrant.objects.update_or_create(
            folder=invitation.folder, user=user,
            defaults={"permission": invitation.permission})
        invitation.state = State.ACCEPTED
        invitation.save(update_fields=["state", "modified_at"])
    return invitation


def decline(invitation_id, user):
    """The invitee rejects an invitation, or its inviter cancels it."""
    with transaction.atomic():
        invitation = _pending(invitation_id, user, "invitee", "inviter")
        invitation.state = State.CANCELED if invitation.inviter_id == user.pk \
            else State.REJECTED
        invitation.save(update_fields=["state", "modified_at"])
    return invitation


def leave(folder, user, *, on_behalf_of=None, superuser=False):
    """A user gives up a folder shared with them (a superuser may do it for another)."""
    if folder.project_id is not None:
        raise FolderError("A project folder cannot be left: it is the project's members'.")
    target = user
    if on_behalf_of is not None and on_behalf_of.pk != user.pk:
        if not superuser:
            raise FolderError("Only a superuser makes another user leave a folder.", 403)
        target = on_behalf_of
    if folder.user_id == target.pk:
        raise FolderError("An owner cannot leave their own folder; delete it instead.")
    deleted, _ = FolderGrant.objects.filter(folder=folder, user=target).delete()
    if not deleted:
        raise FolderError(f"The folder {folder.name!r} is not shared with "
                          f"{email_of(target)}.", 404)


def share(folder, refs, permission):
    """Administrators: give members of a project folder's project another permission on
    it than the members'; the emails shared with."""
    if folder.project_id is None:
        raise FolderError("Only project folders are shared directly; a user's folder is "
                          "shared by inviting users to it.")
    check_permission(permission)
    users = users_named(refs)
    outsiders = [email_of(u) for u in users
                 if not folder.project.members.filter(pk=u.pk).exists()]
    if outsiders:
        raise FolderError(f"Not members of project {folder.project.name}: "
                          f"{', '.join(outsiders)}.", 404, "emails")
    with transaction.atomic():
        for user in users:
            FolderGrant.objects.update_or_create(folder=folder, user=user,
                                                 defaults={"permission": permission})
    return [email_of(u) for u in users]


def unshare(folder, refs):
    """Administrators: the members named go back to the members' permission; the emails
    whose own permission was removed."""
    if folder.project_id is None:
        raise FolderError("Only project folders are unshared; a user who was invited to a "
                          "user's folder leaves it, or its owner takes it back.")
    users = users_named(refs)
    removed = []
    for user in users:
        if FolderGrant.objects.filter(folder=folder, user=user).delete()[0]:
            removed.append(email_of(user))
    return removed


def set_grant(folder, user, permission):
    """The folder's owner (or an admin) changes a user's permission on it, or takes it
    back (`permission` None)."""
    if permission is None:
        deleted, _ = FolderGrant.objects.filter(folder=folder, user=user).delete()
        if not deleted:
            raise FolderError(f"The folder {folder.name!r} is not shared with "
                              f"{email_of(user)}.", 404)
        return None
    check_permission(permission)
    if folder.project_id is not None \
            and not folder.project.members.filter(pk=user.pk).exists():
        raise FolderError(f"{email_of(user)} is not a member of project "
                          f"{folder.project.name}.", 404)
    if folder.user_id == user.pk:
        raise FolderError("The owner's own permission is not shared; it is always rw.")
    updated = FolderGrant.objects.filter(folder=folder, user=user).update(
        permission=permission)
    if not updated and folder.project_id is None:
        raise FolderError(f"The folder {folder.name!r} is not shared with {email_of(user)}; "
                          "invite them.", 404)
    if not updated:
        FolderGrant.objects.create(folder=folder, user=user, permission=permission)
    return permission


def grants_visible_to(user, *, admin=False, folder=None):
    """Grants the user may list: every one for admins; else those on folders they own and
    their own."""
    grants = FolderGrant.objects.select_related("folder__user", "folder__project", "user")
    if not admin:
        grants = grants.filter(Q(folder__user=user) | Q(user=user))
    if folder is not None:
        grants = grants.filter(folder=folder)
    return grants.order_by("folder__name", "user__username")


def change_owner(folder, new_owner):
    """Superusers: a user's folder becomes another user's (its files stay where they are).
    The new owner's grant on it, if any, goes: they own it now."""
    if folder.project_id is not None:
        raise FolderError("A project folder belongs to its project; only a user's folder "
                          "changes owner.")
    if folder.user_id == new_owner.pk:
        return folder
    with transaction.atomic():
        if Folder.objects.filter(user=new_owner, name=folder.name).exists():
            raise FolderError(f"{email_of(new_owner)} has a folder named {folder.name!r} "
                              "already.", 409)
        FolderGrant.objects.filter(folder=folder, user=new_owner).delete()
        Folder.objects.filter(pk=folder.pk).update(user=new_owner)
    folder.refresh_from_db()
    return folder


def rename(folder, user, new_name, *, admin=False):
    """Rename a folder (its owner, or admins for project folders); the name rules and
    uniqueness of a new folder apply."""
    if not (admin or folder.user_id == user.pk):
        raise FolderError(f"Only the owner of {folder.name!r} renames it.", 403)
    if not isinstance(new_name, str) or not NAME_PATTERN.match(new_name):
        raise FolderError("A folder name is 1 to 64 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit.", field="new_name")
    owners = Q(project=folder.project) if folder.project_id else Q(user=folder.user)
    with transaction.atomic():
        if Folder.objects.filter(owners, name=new_name).exclude(pk=folder.pk).exists():
            raise FolderError(f"There is a folder named {new_name!r} already.", 409,
                              "new_name")
        Folder.objects.filter(pk=folder.pk).update(name=new_name)
    folder.refresh_from_db()
    return folder

