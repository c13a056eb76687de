import contextlib
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from common.slots import ResourceSlots, SlotError

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


def default_lost_timeout():
    return settings.AGENT_LOST_TIMEOUT


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
        default=86400, help_text="Seconds a session may stay PENDING before it is cancelled "
                                 "(pending-timeout); 0 means no limit.")
    # The timeouts of the transitional statuses: none is a place to stay for ever.
    scheduled_timeout = models.PositiveIntegerField(
        default=60, help_text="Seconds a kernel may stay SCHEDULED (its agent not yet asked "
                              "for the image) before its session is rescheduled on another "
                              "agent.")
    preparing_timeout = models.PositiveIntegerField(
        default=120, help_text="Seconds a kernel may stay PREPARING (the agent checking its "
                               "image) before a retry; after the retries the session is "
                               "rescheduled on another agent.")
    pull_timeout = models.PositiveIntegerField(
        default=600, help_text="Seconds a kernel may stay PULLING before a retry (the pull "
                               "itself is never killed); after the retries the session is "
                               "rescheduled on another agent.")
    prepared_timeout = models.PositiveIntegerField(
        default=300, help_text="Seconds a kernel may wait PREPARED (for its session's other "
                               "kernels) before its session is rescheduled.")
    create_timeout = models.PositiveIntegerField(
        default=120, help_text="Seconds a kernel may stay CREATING before a retry; after the "
                               "retries the session is rescheduled on another agent.")
    terminate_timeout = models.PositiveIntegerField(
        default=120, help_text="Seconds added to a kernel's grace period (its session's, else "
                               "DEFAULT_GRACE_PERIOD) for how long it may stay TERMINATING "
                               "before its agent is told to kill it at once (SIGKILL, no "
                               "hook); after as long again without an answer the kernel goes "
                               "to ERROR. kubelet's margin: grace period + 2 minutes.")
    # Retries of a failed stage (Sokovan's recovery handlers), spaced out.
    retry_backoff = models.PositiveIntegerField(
        default=2, help_text="Seconds before the first retry of a failed stage (pull, "
                             "create); each next retry waits twice as long, up to "
                             "retry_backoff_max, with random jitter (between half and all of "
                             "it).")
    retry_backoff_max = models.PositiveIntegerField(
        default=60, help_text="The longest wait before a retry, in seconds.")
    exclusion_timeout = models.PositiveIntegerField(
        default=300, help_text="Seconds an agent stays excluded for a session after a stage "
                               "of it failed there for good (its retries spent, or a cause of "
                               "the agent's own); then the session may go there again.")
    lost_timeout = models.PositiveIntegerField(
        default=default_lost_timeout,
        help_text="Seconds an agent may stay LOST (no heartbeat) before its kernels are "
                  "ended with agent-lost. Until then a lost agent only takes no new kernels: "
                  "its sessions keep running and recover when it reports again.")
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
    reservation_after = models.PositiveIntegerField(
        default=600,
        help_text="Seconds a session may wait before it gets a reservation: the earliest time "
                  "and agents at which it fits; smaller sessions then start before it only on "
                  "other agents or if they end before that time (backfill). 0 means off.")
    allow_preemption = models.BooleanField(
        default=False,
        help_text="A waiting session may end preemptible RUNNING sessions of lower priority "
                  "(gracefully, reason preempted) when no agent has room for it.")
    preemption_min_runtime = models.PositiveIntegerField(
        default=600, help_text="Seconds a session runs before it may be preempted.")
    storage_root = models.CharField(
        max_length=1024, blank=True,
        help_text="The directory (on every agent host of this group and the web host: a shared "
                  "filesystem for several hosts) under which storage folders live; empty means "
                  "the STORAGE_ROOT setting.")
    requeue_preempted_batch = models.BooleanField(
        default=False,
        help_text="A preempted batch session goes back to PENDING once its kernels have "
                  "stopped (gracefully, as any preempted session), in its place in the queue, "
                  "and runs again later; off: it ends (TERMINATED, reason preempted).")
    # Backend.AI's kernel-uid / kernel-gid (an agent setting there; a group's here, so that
    # the agents of one group agree): docs/agent.md, "The kernel's user".
    kernel_uid = models.PositiveIntegerField(
        default=1000,
        help_text="The user id a kernel's processes run as (its command, terminals, "
                  "executions, services, the pre-stop hook); its /home/work and read-write "
                  "folders are owned by it while it runs. 0 runs them as root (not advised).")
    kernel_gid = models.PositiveIntegerField(
        default=1000, help_text="The group id a kernel's processes run as.")
    class CullAction(models.TextChoices):
        STOP = "stop"
        TERMINATE = "terminate"

    cull_action = models.CharField(
        max_length=16, choices=CullAction, default=CullAction.STOP,
        help_text="What idle culling does to an interactive session: stop it (its compute "
                  "freed, its files kept, its owner may resume it: Kubeflow's culler) or "
                  "terminate it. Batch sessions are always terminated.")
    stopped_retention = models.PositiveIntegerField(
        default=14 * 86400,
        help_text="Seconds a stopped session is kept; then it is deleted with its files "
                  "(its owner warned a day before). 0 means for ever.")
    aging_interval = models.PositiveIntegerField(
        default=0,
        help_text="Every this many seconds of waiting raise a pending session's priority by "
                  "one; 0 means off.")

    def __str__(self):
        return self.name

    def timeout_of(self, status, grace_period=0):
        """Seconds a kernel may stay in `status`; None for a status without a timeout.
        TERMINATING: its grace period (`grace_period`, the session's grace_seconds) plus
        this group's margin, so that a stop is never cut short by the timeout."""
        if str(status) == "TERMINATING":
            return grace_period + self.terminate_timeout
        return {"SCHEDULED": self.scheduled_timeout, "PREPARING": self.preparing_timeout,
                "PULLING": self.pull_timeout, "PREPARED": self.prepared_timeout,
                "CREATING": self.create_timeout}.get(str(status))


class ResourcePreset(models.Model):
    """A named size of session (Backend.AI's resource preset) that clients offer: its
    slots, and optionally its shared memory and the one scaling group it is for."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=256, unique=True)
    resource_slots = SlotsField(help_text='Per kernel, such as {"cpu": "2", "mem": "4g"}.')
    shared_memory = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Bytes of /dev/shm; empty: the default.")
    scaling_group = models.ForeignKey(
        ScalingGroup, null=True, blank=True, on_delete=models.CASCADE,
        related_name="resource_presets", help_text="Empty: offered in every scaling group.")

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


def default_of(model):
    """The row named `default`, created on first use."""
    return model.objects.get_or_create(name=DEFAULT_NAME)[0]
