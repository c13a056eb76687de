import contextlib

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from .slots import ResourceSlots, SlotError

DEFAULT_NAME = "default"


def validate_slots(value):
    try:
        ResourceSlots.parse(value)
    except SlotError as exc:
        raise ValidationError(str(exc)) from None


class SlotsField(models.JSONField):
    """JSON of resource slots; stored canonical (cpu cores, mem bytes) on save."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("default", dict)
        kwargs.setdefault("blank", True)
        kwargs.setdefault("validators", [validate_slots])
        super().__init__(*args, **kwargs)

    def get_prep_value(self, value):
        if isinstance(value, dict):
            with contextlib.suppress(SlotError):  # left to the validator, which says why
                value = ResourceSlots.parse(value).to_json()
        return super().get_prep_value(value)


class Domain(models.Model):
    name = models.CharField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    is_active = models.BooleanField(default=True)
    total_resource_slots = SlotsField(help_text="Empty means unlimited.")

    def __str__(self):
        return self.name


class Project(models.Model):
    """Backend.AI calls a project a "group"."""

    domain = models.ForeignKey(Domain, on_delete=models.PROTECT, related_name="projects")
    name = models.CharField(max_length=64)
    description = models.TextField(blank=True)
    is_active = models.BooleanField(default=True)
    total_resource_slots = SlotsField(help_text="Empty means unlimited.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["domain", "name"], name="project_unique_in_domain")
        ]

    def __str__(self):
        return self.name


class ScalingGroup(models.Model):
    class Scheduler(models.TextChoices):
        FIFO = "fifo"
        LIFO = "lifo"
        DRF = "drf"

    class AgentSelection(models.TextChoices):
        CONCENTRATED = "concentrated"
        DISPERSED = "dispersed"
        ROUNDROBIN = "roundrobin"

    name = models.CharField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    is_active = models.BooleanField(default=True)
    scheduler = models.CharField(max_length=16, choices=Scheduler, default=Scheduler.FIFO)
    agent_selection_strategy = models.CharField(
        max_length=16, choices=AgentSelection, default=AgentSelection.CONCENTRATED
    )
    pending_timeout = models.PositiveIntegerField(
        default=0, help_text="Seconds a session may stay PENDING; 0 means no limit."
    )
    pull_timeout = models.PositiveIntegerField(
        default=600, help_text="Seconds a kernel may stay PULLING before a retry.")
    create_timeout = models.PositiveIntegerField(
        default=120, help_text="Seconds a kernel may stay CREATING before a retry.")
    terminate_timeout = models.PositiveIntegerField(
        default=300, help_text="Seconds a kernel may stay TERMINATING before it is "
                               "force-terminated.")
    validators = models.JSONField(
        default=list, blank=True,
        help_text="Names of the scheduler's validators to run; empty means all of them "
                  "(keypair-resources, project-resources, domain-resources, concurrency, "
                  "dependencies).")
    idle_checkers = models.JSONField(
        default=list, blank=True,
        help_text="Idle checkers to run for this group's sessions, among network-timeout, "
                  "session-lifetime, utilization, app-activity and batch-timeout; empty "
                  "means the IDLE_DEFAULT_CHECKERS setting (all but utilization).")
    allow_outbound = models.BooleanField(
        default=True,
        help_text="Kernels may open connections beyond their session's network (the "
                  "internet, other hosts). Off: an internal network, only the session's own "
                  "kernels. The agent host's own services are out of reach either way.")
    roundrobin_cursor = models.CharField(
        max_length=64, blank=True, editable=False,
        help_text="The agent the round-robin selector placed a kernel on last.")

    def __str__(self):
        return self.name


class ResourcePolicy(models.Model):
    name = models.CharField(max_length=64, unique=True)
    total_resource_slots = SlotsField(help_text="Per keypair; empty means unlimited.")
    max_concurrent_sessions = models.PositiveIntegerField(default=30)
    max_pending_session_count = models.PositiveIntegerField(
        null=True, blank=True, help_text="Empty means unlimited."
    )
    idle_timeout = models.PositiveIntegerField(default=0, help_text="Seconds; 0 means off.")
    max_session_lifetime = models.PositiveIntegerField(default=0, help_text="Seconds; 0 means off.")
    # Kernel hardening: a fork bomb or a descriptor leak stays inside its own container.
    kernel_pids_limit = models.PositiveIntegerField(
        default=1024, validators=[MinValueValidator(16)],
        help_text="Processes and threads one kernel container may have at once.")
    kernel_open_files_limit = models.PositiveIntegerField(
        default=8192, validators=[MinValueValidator(64)],
        help_text="Open files per process in a kernel container (RLIMIT_NOFILE).")

    class Meta:
        verbose_name_plural = "resource policies"

    def __str__(self):
        return self.name


def default_of(model):
    """The row named `default`, created on first use."""
    return model.objects.get_or_create(name=DEFAULT_NAME)[0]


def default_project():
    return Project.objects.get_or_create(domain=default_of(Domain), name=DEFAULT_NAME)[0]


def ensure_defaults():
    """The `default` domain, project, scaling group and resource policy."""
    for model in (Domain, ScalingGroup, ResourcePolicy):
        default_of(model)
    return default_project()
