"""Storage folders: directories under a storage root that outlive sessions, and the
mounts that put them into a session's kernels."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from identity_app.roles import is_admin
from identity_app.visibility import RestrictedQuerySet


class FolderQuerySet(RestrictedQuerySet):
    def visible_to(self, user, keypair=None):
        return self.seen_by(user, admin=is_admin(user, keypair))

    def seen_by(self, user, *, admin=False):
        """A user's own folders, their projects', and the users' folders shared with them
        (an accepted invitation); every folder for admins; none for an anonymous user."""
        if admin:
            return self
        if user is None or not user.is_authenticated:
            return self.none()
        return self.filter(Q(user=user) | Q(project__members=user)
                           | Q(user__isnull=False, grants__user=user)).distinct()


class Folder(models.Model):
    """A user's folder, or a project's (shared with its members). Its files live in
    <storage root of its scaling group>/<id hex>, on every agent host of that group."""

    class Permission(models.TextChoices):
        READ_WRITE = "rw"
        READ_ONLY = "ro"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=64)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.CASCADE, related_name="folders")
    project = models.ForeignKey("identity_app.Project", null=True, blank=True,
                                on_delete=models.CASCADE, related_name="folders")
    scaling_group = models.ForeignKey("scheduling_app.ScalingGroup", on_delete=models.PROTECT,
                                      related_name="folders")
    quota = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Bytes the folder may hold; empty means unlimited. "
                                         "Set from the owner's resource policy on creation.")
    member_permission = models.CharField(
        max_length=2, choices=Permission, default=Permission.READ_WRITE,
        help_text="How a project's members may use a project folder.")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = FolderQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], condition=Q(user__isnull=False),
                                    name="folder_name_unique_per_user"),
            models.UniqueConstraint(fields=["project", "name"],
                                    condition=Q(project__isnull=False),
                                    name="folder_name_unique_per_project"),
            models.CheckConstraint(condition=Q(user__isnull=False) ^ Q(project__isnull=False),
                                   name="folder_has_one_owner"),
        ]
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def owner_label(self):
        return f"project {self.project.name}" if self.project_id else self.user.get_username()


class Mount(models.Model):
    """A folder mounted into every kernel of a session."""

    session = models.ForeignKey("sessions_app.Session", on_delete=models.CASCADE,
                                related_name="mounts")
    folder = models.ForeignKey(Folder, on_delete=models.PROTECT, related_name="mounts")
    path = models.CharField(max_length=255)
    mode = models.CharField(max_length=2, choices=Folder.Permission,
                            default=Folder.Permission.READ_WRITE)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "path"], name="mount_path_unique"),
        ]

    def __str__(self):
        return f"{self.folder.name} at {self.path} ({self.mode})"


class Upload(models.Model):
    """A resumable upload (tus 1.0 core + creation): the bytes so far are in a partial
    file under the storage root's .uploads directory; the last part renames it into place."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    folder = models.ForeignKey(Folder, on_delete=models.CASCADE, related_name="uploads")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    path = models.CharField(max_length=4096)
    length = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"upload of {self.path} ({self.length} bytes)"


class GrantPermission(models.TextChoices):
    """What another user may do in a folder shared with them (Backend.AI's mount
    permissions): read; read and write; write and delete, which here is the same as
    read-write (rw already deletes files), kept as the client gave it."""

    READ_ONLY = "ro"
    READ_WRITE = "rw"
    WRITE_DELETE = "wd"


class FolderInvitation(models.Model):
    """An owner's offer of their folder to another user; accepting it makes a FolderGrant.
    Rows stay after they are answered, as the record of who offered what to whom."""

    class State(models.TextChoices):
        PENDING = "pending"
        ACCEPTED = "accepted"
        REJECTED = "rejected"  # by the invitee
        CANCELED = "canceled"  # by the inviter

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    folder = models.ForeignKey(Folder, on_delete=models.CASCADE, related_name="invitations")
    inviter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="folder_invitations_sent")
    invitee = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="folder_invitations")
    permission = models.CharField(max_length=2, choices=GrantPermission,
                                  default=GrantPermission.READ_WRITE)
    state = models.CharField(max_length=8, choices=State, default=State.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    modified_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["folder", "invitee"], condition=Q(state="pending"),
                                    name="one_pending_invitation_per_invitee"),
        ]
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.folder.name} to {self.invitee.get_username()} ({self.state})"


class FolderGrant(models.Model):
    """A user's permission on a folder that is not theirs: an accepted invitation to a
    user's folder (the folder is then theirs to use until they leave or the owner
    takes it back), or an administrator's share of a project folder with one of its
    members, which overrides the members' permission for that member only."""

    folder = models.ForeignKey(Folder, on_delete=models.CASCADE, related_name="grants")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="folder_grants")
    permission = models.CharField(max_length=2, choices=GrantPermission,
                                  default=GrantPermission.READ_WRITE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["folder", "user"], name="one_grant_per_user"),
        ]

    def __str__(self):
        return f"{self.folder.name} for {self.user.get_username()} ({self.permission})"
