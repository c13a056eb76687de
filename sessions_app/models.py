import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from agents_app.models import AgentStatus
from common import clock
from identity_app.models import Domain, KeyPair, Project
from scheduling_app.models import ScalingGroup, SlotsField
from sessions_app.enums import ClusterMode, SessionResult, SessionType, Status, StatusGroup
from sessions_app.querysets import KernelQuerySet, OwnedQuerySet, SessionQuerySet
from sessions_app.status_data import Key, StatusData

# The statuses in which a kernel's stage may wait for a retry, and the stage's name.
RETRYING = {Status.PREPARING: "preparing", Status.PULLING: "preparing",
            Status.CREATING: "creating"}


class StatusFields(models.Model):
    """Status columns shared by sessions and kernels; written only by sessions_app.engine."""

    status = models.CharField(max_length=16, choices=Status, default=Status.PENDING)
    status_info = models.CharField(max_length=255, blank=True, help_text="The reason.")
    status_data = models.JSONField(default=dict, blank=True)
    status_history = models.JSONField(default=dict, blank=True)
    status_changed = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class Session(StatusFields):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=64)
    keypair = models.ForeignKey(KeyPair, on_delete=models.PROTECT, related_name="sessions")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="compute_sessions"
    )
    domain = models.ForeignKey(Domain, on_delete=models.PROTECT)
    project = models.ForeignKey(Project, on_delete=models.PROTECT)
    session_type = models.CharField(
        max_length=16, choices=SessionType, default=SessionType.INTERACTIVE
    )
    cluster_mode = models.CharField(
        max_length=16, choices=ClusterMode, default=ClusterMode.SINGLE_NODE
    )
    cluster_size = models.PositiveSmallIntegerField(default=1)
    image = models.CharField(max_length=255)
    requested_slots = SlotsField(help_text="Per kernel.")
    occupying_slots = SlotsField(help_text="All kernels together.")
    scaling_group = models.ForeignKey(ScalingGroup, on_delete=models.PROTECT)
    startup_command = models.TextField(blank=True)
    bootstrap_script = models.TextField(
        blank=True, help_text="Run once in the main kernel before the startup command; its "
                              "output is in the session's log.")
    environ = models.JSONField(
        default=dict, blank=True, help_text="The owner's environment variables for every kernel.")
    batch_timeout = models.PositiveIntegerField(null=True, blank=True, help_text="Seconds.")
    grace_period = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds between SIGTERM and SIGKILL; empty = default."
    )
    pre_stop_command = models.TextField(
        blank=True, help_text="Run in each container before it is stopped (within the grace "
                              "period).")
    cluster_ssh = models.JSONField(
        default=dict, blank=True, editable=False,
        help_text="The SSH keypair the kernels of a cluster session share.")
    tag = models.CharField(max_length=64, blank=True)
    dependencies = models.ManyToManyField(
        "self", symmetrical=False, blank=True, related_name="dependents",
        help_text="Sessions that must be RUNNING (or, if batch, finished with success) "
                  "before this one is scheduled.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    last_activity = models.DateTimeField(
        null=True, blank=True,
        help_text="The last use of any kind: the owner's API calls on it, commands, the "
                  "terminal and app traffic, and (from the idle check) its app's kernels.")
    last_activity_check = models.DateTimeField(
        null=True, blank=True, help_text="When the idle check last looked at it.")
    idle_exempt = models.BooleanField(
        default=False, help_text="Never culled for idleness or lifetime.")
    priority = models.PositiveIntegerField(
        default=10, help_text="Higher goes first in its scaling group's queue.")
    preemptible = models.BooleanField(
        default=False, help_text="May be ended for a waiting session of higher priority, in "
                                 "a scaling group that allows preemption.")
    starts_at = models.DateTimeField(null=True, blank=True)
    # Backend.AI's starts_at (a batch session's requested start), a name of its own here:
    # starts_at above is when the session started running.
    not_before = models.DateTimeField(
        null=True, blank=True,
        help_text="Its owner asked it to start no earlier than this: PENDING until then.")
    designated_agents = models.JSONField(
        default=list, blank=True,
        help_text="Agents an admin asked it to run on (Backend.AI's agentList); empty: any.")
    terminated_at = models.DateTimeField(null=True, blank=True)
    result = models.CharField(
        max_length=16, choices=SessionResult, default=SessionResult.UNDEFINED
    )

    objects = SessionQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        permissions = [("force_terminate_session", "Can force-terminate sessions")]
        constraints = [
            models.UniqueConstraint(
                fields=["keypair", "name"],
                condition=~Q(status__in=[Status.TERMINATED, Status.CANCELLED]),
                name="session_name_unique_among_live",
                violation_error_message="You already have a live session with this name.",
            ),
            models.CheckConstraint(
                condition=Q(cluster_size__gte=1), name="session_cluster_size_positive"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "scaling_group"]),
        ]

    def __str__(self):
        return self.name

    @property
    def is_finished(self):
        return self.status in StatusGroup.FINISHED

    @property
    def pending_reason(self):
        """Why the session is not running yet: why the scheduler has not placed a PENDING
        session, or, while a stage of its kernels waits for a retry, which and when (reads
        the kernels prefetched); "" otherwise."""
        if self.status == Status.PENDING:
            failed = self.status_data.get("scheduler", {}).get("failed_predicates", [])
            return "; ".join(p["msg"] for p in failed) or "waiting for the scheduler"
        if self.status not in StatusGroup.STARTING:
            return ""
        return "; ".join(filter(None, (k.retry_reason for k in self.kernels.all())))

    @property
    def queue(self):
        """A PENDING session's place in its scaling group's queue and predicted start, as
        the scheduler's last pass wrote them; None in other statuses or before a pass."""
        record = self.status_data.get("scheduler", {})
        if self.status != Status.PENDING or record.get("queue_position") is None:
            return None
        return {"position": record["queue_position"], "length": record.get("queue_length"),
                "rank": record.get("rank", self.priority),
                "predicted_start": record.get("predicted_start"),
                "unknown_reason": record.get("prediction_unknown") or "",
                "reservation": record.get("reservation"),
                "as_of": record.get("last_try")}

    @property
    def unreachable_agents(self):
        """Agents of its live kernels that stopped reporting (LOST): the kernels keep their
        status until the agent is back or its lost_timeout ends them. Reads the kernels
        and agents prefetched with `kernels__agent`."""
        return sorted({k.agent_id for k in self.kernels.all()
                       if k.agent_id and k.status not in StatusGroup.FINISHED
                       and k.agent.status == AgentStatus.LOST})

    @property
    def grace_seconds(self):
        """The grace period its kernels get between SIGTERM and SIGKILL: its own, else
        DEFAULT_GRACE_PERIOD."""
        return settings.DEFAULT_GRACE_PERIOD if self.grace_period is None else self.grace_period

    @property
    def main_kernel(self):
        return min(self.kernels.all(), key=lambda k: (k.cluster_role != "main", k.cluster_idx))


class Kernel(StatusFields):
    class ClusterRole(models.TextChoices):
        MAIN = "main"
        SUB = "sub"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="kernels")
    cluster_role = models.CharField(max_length=8, choices=ClusterRole, default=ClusterRole.MAIN)
    cluster_idx = models.PositiveSmallIntegerField(default=1)
    agent = models.ForeignKey(
        "agents_app.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="kernels"
    )
    agent_addr = models.CharField(max_length=128, blank=True)
    container_id = models.CharField(max_length=64, blank=True)
    image = models.CharField(max_length=255)
    requested_slots = SlotsField()
    occupied_slots = SlotsField()
    exit_code = models.IntegerField(null=True, blank=True)
    last_stat = models.JSONField(default=dict, blank=True)
    log_tail = models.TextField(blank=True, help_text="The last 64 KiB of the container's log, "
                                                      "kept when it was removed.")
    stat_history = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="Recent utilization samples for the idle checks, summed in buckets "
                  "(sessions_app/utilization.py).")
    created_at = models.DateTimeField(auto_now_add=True)
    terminated_at = models.DateTimeField(null=True, blank=True)
    device_allocation = models.JSONField(
        default=dict, blank=True,
        help_text="Which of its agent's devices it holds, {slot: {device id: amount}}: the "
                  "scheduler's plan until the agent's allocation replaces it at the start.")
    kept_on = models.CharField(
        max_length=64, blank=True,
        help_text="The agent that keeps this kernel's files while its session is stopped "
                  "(its stopped container and scratch volume), until resumed or deleted.")
    kept = models.JSONField(
        default=dict, blank=True,
        help_text="What its agent keeps: {container_id, volume, bytes}.")

    objects = KernelQuerySet.as_manager()

    class Meta:
        ordering = ["cluster_role", "cluster_idx"]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "cluster_role", "cluster_idx"], name="kernel_unique_in_cluster"
            )
        ]
        indexes = [models.Index(fields=["status", "agent"])]

    def __str__(self):
        return f"{self.session.name}/{self.cluster_hostname}"

    @property
    def is_main(self):
        return self.cluster_role == self.ClusterRole.MAIN

    @property
    def cluster_hostname(self):
        return f"{self.cluster_role}{self.cluster_idx}"

    @property
    def retry_reason(self):
        """While the kernel's stage waits for (or is at) a retry: the try, when, and the
        failure it follows; "" otherwise."""
        data = StatusData(self.status_data)
        stage = RETRYING.get(self.status)
        if stage is None or data.next_retry is None:
            return ""
        tries = data.retries.get(stage, 0)
        if not tries:
            return ""
        when = data.next_retry
        at = when.isoformat(timespec="seconds")
        step = f"try {tries + 1} of {settings.RETRY_LIMIT}"
        error = data.raw.get(Key.LAST_ERROR, "")
        if when > clock.now():
            return f"{self.cluster_hostname}: {stage} failed ({error}); {step} at {at}"
        return f"{self.cluster_hostname}: {stage} failed ({error}); {step} since {at}"


class SessionEvent(models.Model):
    """Append-only history of a session: its users' timeline and the audit trail."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    kernel = models.ForeignKey(
        Kernel, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    name = models.CharField(max_length=64)
    from_status = models.CharField(max_length=16, choices=Status, blank=True)
    to_status = models.CharField(max_length=16, choices=Status, blank=True)
    reason = models.CharField(max_length=255, blank=True)
    actor = models.CharField(max_length=150, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["session", "created_at"])]

    def __str__(self):
        return f"{self.name} {self.from_status}→{self.to_status}"


class SessionTemplate(models.Model):
    """A stored session request (Backend.AI's task template), per user and project.

    `template` is the template document as the client sent it, parsed (YAML or JSON):
    `metadata.name`, `metadata.tag`, and under `spec` the session type, image, resources,
    environ, bootstrap and startup commands, mounts and scaling group.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=128, blank=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="session_templates")
    project = models.ForeignKey(Project, on_delete=models.CASCADE,
                                related_name="session_templates")
    template = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    modified_at = models.DateTimeField(auto_now=True)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return self.name or str(self.pk)


class BackgroundTask(models.Model):
    """A long job of a user's, followed by Backend.AI's background-task events
    (`GET /events/background-task`): for now, committing a session's main kernel as an
    image (sessions_app/commits.py). Its last progress is kept here, so that a client that
    starts listening late, or on another web process, still hears how it ended."""

    class State(models.TextChoices):
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=32)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="background_tasks")
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="background_tasks")
    state = models.CharField(max_length=16, choices=State, default=State.RUNNING)
    current_progress = models.FloatField(default=0)
    total_progress = models.FloatField(default=0)
    message = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["session", "state"])]

    def __str__(self):
        return f"{self.kind} {self.pk} ({self.state})"


class ManagerState(models.Model):
    """The manager's status, one row (pk 1): running, or frozen for maintenance (no new
    sessions; running ones go on). In the database, so that every web process and worker
    answers alike."""

    class Status(models.TextChoices):
        RUNNING = "running"
        FROZEN = "frozen"

    status = models.CharField(max_length=16, choices=Status, default=Status.RUNNING)
    changed_at = models.DateTimeField(null=True, blank=True)
    changed_by = models.CharField(max_length=150, blank=True)
    announcement_enabled = models.BooleanField(default=False)
    announcement = models.TextField(blank=True, help_text="Shown to the clients that ask.")

    class Meta:
        verbose_name = "manager state"

    def __str__(self):
        return self.status


class KernelStat(models.Model):
    """A kernel's measures at one time, as its agent's heartbeat reported them (`step` 0),
    or a minute's / an hour's of them (`step` 60 / 3600: averages, with the maxima beside;
    the counters' last values). sessions_app.series keeps and compacts them."""

    kernel = models.ForeignKey(Kernel, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()
    step = models.PositiveIntegerField(default=0, help_text="0: raw; else the seconds averaged.")
    cpu_percent = models.FloatField(null=True)
    cpu_percent_max = models.FloatField(null=True)
    cpu_seconds = models.FloatField(null=True, help_text="Cumulative CPU time.")
    mem_bytes = models.BigIntegerField(null=True)
    mem_bytes_max = models.BigIntegerField(null=True)
    net_rx = models.BigIntegerField(null=True, help_text="Cumulative bytes received.")
    net_tx = models.BigIntegerField(null=True)
    blk_read = models.BigIntegerField(null=True, help_text="Cumulative bytes read.")
    blk_write = models.BigIntegerField(null=True)
    device_util = models.FloatField(null=True, help_text="Mean utilization of its devices, %.")
    device_util_max = models.FloatField(null=True)

    class Meta:
        indexes = [models.Index(fields=["kernel", "step", "at"]),
                   models.Index(fields=["step", "at"])]

    def __str__(self):
        return f"{self.kernel_id} at {self.at}"


class OccupancySample(models.Model):
    """An agent's slots at one time: what RUNNING kernels use, what kernels on their way
    (SCHEDULED to CREATING) reserve, and what it has; the overview draws a day of them."""

    at = models.DateTimeField(db_index=True)
    agent = models.ForeignKey("agents_app.Agent", on_delete=models.CASCADE, related_name="+")
    scaling_group = models.CharField(max_length=64)
    available = SlotsField()
    used = SlotsField()
    reserved = SlotsField()

    def __str__(self):
        return f"{self.agent_id} at {self.at}"
