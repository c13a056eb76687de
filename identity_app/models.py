"""Identity and tenancy: who acts (users' keypairs), in which domain and project, under
which resource policy. The tables keep their names from before this app (sessions_app's
keypairs, scheduling_app's domains, projects and policies): the move was state only."""

import secrets
import string

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from identity_app.encryption import EncryptedSecretField
from identity_app.visibility import OwnedQuerySet
from scheduling_app.models import DEFAULT_NAME, ScalingGroup, SlotsField, default_of


class Domain(models.Model):
    name = models.CharField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    is_active = models.BooleanField(default=True)
    total_resource_slots = SlotsField(help_text="Empty means unlimited.")
    max_concurrent_sessions = models.PositiveIntegerField(
        null=True, blank=True, help_text="Sessions the domain's users may run at once in all; "
                                         "empty means unlimited.")

    class Meta:
        db_table = "scheduling_app_domain"  # its table from before identity_app

    def __str__(self):
        return self.name


class Project(models.Model):
    """Backend.AI calls a project a "group"."""

    domain = models.ForeignKey(Domain, on_delete=models.PROTECT, related_name="projects")
    name = models.CharField(max_length=64)
    description = models.TextField(blank=True)
    is_active = models.BooleanField(default=True)
    total_resource_slots = SlotsField(help_text="Empty means unlimited.")
    max_concurrent_sessions = models.PositiveIntegerField(
        null=True, blank=True, help_text="Sessions of the project that may run at once in "
                                         "all; empty means unlimited.")
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="member_projects",
        help_text="Users who share the project's storage folders.")

    class Meta:
        db_table = "scheduling_app_project"
        constraints = [
            models.UniqueConstraint(fields=["domain", "name"], name="project_unique_in_domain")
        ]

    def __str__(self):
        return self.name


class ResourcePolicy(models.Model):
    name = models.CharField(max_length=64, unique=True)
    total_resource_slots = SlotsField(help_text="Per keypair; empty means unlimited.")
    max_concurrent_sessions = models.PositiveIntegerField(default=30)
    max_concurrent_sessions_per_user = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Sessions a user of this policy may run at once over all their keypairs "
                  "(the session's keypair's policy decides); empty means unlimited.")
    max_pending_session_count = models.PositiveIntegerField(
        null=True, blank=True, help_text="Empty means unlimited."
    )
    idle_timeout = models.PositiveIntegerField(default=0, help_text="Seconds; 0 means off.")
    max_session_lifetime = models.PositiveIntegerField(default=0, help_text="Seconds; 0 means off.")
    default_priority = models.PositiveIntegerField(
        default=10, help_text="A new session's priority; users may ask for a lower one.")
    preemptible = models.BooleanField(
        default=False, help_text="Every session of this policy may be preempted.")
    max_priority = models.PositiveIntegerField(
        default=100, help_text="The highest priority an admin may give a session.")
    # Kernel hardening: a fork bomb or a descriptor leak stays inside its own container.
    kernel_pids_limit = models.PositiveIntegerField(
        default=1024, validators=[MinValueValidator(16)],
        help_text="Processes and threads one kernel container may have at once.")
    kernel_open_files_limit = models.PositiveIntegerField(
        default=8192, validators=[MinValueValidator(64)],
        help_text="Open files per process in a kernel container (RLIMIT_NOFILE).")

    storage_quota = models.PositiveBigIntegerField(
        default=0,
        help_text="Bytes a user's stopped sessions may keep in all (their kernels' kept "
                  "files, as their agents measure them; storage folders have their own "
                  "quota); 0 means unlimited. A stop is refused once they are over it.")

    # Storage folders (storage_app).
    max_folder_count = models.PositiveIntegerField(
        default=10, help_text="Storage folders a user may own.")
    max_folder_size = models.PositiveBigIntegerField(
        default=0, help_text="Bytes one storage folder may hold; 0 means unlimited.")

    class Meta:
        db_table = "scheduling_app_resourcepolicy"
        verbose_name_plural = "resource policies"

    def __str__(self):
        return self.name


def generate_access_key():
    alphabet = string.ascii_uppercase + string.digits
    return "AKIA" + "".join(secrets.choice(alphabet) for _ in range(16))


def generate_secret_key():
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(40))


class KeyPair(models.Model):
    access_key = models.CharField(max_length=20, primary_key=True, default=generate_access_key)
    # Encrypted at rest (identity_app/encryption.py); a Fernet token is ~150 characters.
    secret_key = EncryptedSecretField(max_length=255, default=generate_secret_key)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="keypairs"
    )
    is_main = models.BooleanField(
        default=False, help_text="The keypair that browser sessions of this user act through."
    )
    is_active = models.BooleanField(default=True)
    is_admin = models.BooleanField(default=False)
    resource_policy = models.ForeignKey(ResourcePolicy, on_delete=models.PROTECT)
    concurrency_used = models.PositiveIntegerField(default=0)
    rate_limit = models.PositiveIntegerField(default=10000, help_text="Requests per 15 minutes.")
    last_used = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        db_table = "sessions_app_keypair"  # its table from before identity_app
        constraints = [
            models.UniqueConstraint(
                fields=["user"], condition=Q(is_main=True), name="one_main_keypair_per_user"
            )
        ]

    def __str__(self):
        return self.access_key


def default_project():
    return Project.objects.get_or_create(domain=default_of(Domain), name=DEFAULT_NAME)[0]


def ensure_defaults():
    """The `default` domain, project, scaling group and resource policy."""
    for model in (Domain, ScalingGroup, ResourcePolicy):
        default_of(model)
    return default_project()


class AuditEntry(models.Model):
    """One privileged act or login: who (user and keypair), for whom, from where, what, the
    result. Written by identity_app.audit; read-only in the admin."""

    class Result(models.TextChoices):
        OK = "ok"
        REFUSED = "refused"
        ERROR = "error"

    at = models.DateTimeField(db_index=True)
    # The name stays when the user row is deleted.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.SET_NULL, related_name="+")
    username = models.CharField(max_length=150, help_text='The actor\'s name, or "system".')
    access_key = models.CharField(max_length=20, blank=True,
                                  help_text="The keypair the actor acted through.")
    on_behalf_of = models.CharField(max_length=150, blank=True,
                                    help_text="The owner acted for (an access key or a user).")
    address = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    result = models.CharField(max_length=8, choices=Result, default=Result.OK)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.username} {self.action} {self.result}"
