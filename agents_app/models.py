import logging

from django.db import models

from common.slots import ResourceSlots, SlotError
from scheduling_app.models import ScalingGroup, SlotsField

log = logging.getLogger(__name__)
# Backend.AI's labels of the resources a kernel of an image needs at least and may use at
# most, one per slot: ai.backend.resource.min.cpu = "1", ai.backend.resource.min.mem = "256m".
MIN_LABEL = "ai.backend.resource.min."
MAX_LABEL = "ai.backend.resource.max."
# A committed session's image (sessions_app/commits.py) is its owner's: "user:<user id>".
OWNER_LABEL = "ai.backend.customized-image.owner"
CUSTOMIZED_NAME_LABEL = "ai.backend.customized-image.name"
COMMITTED_FROM_LABEL = "ai.backend.committed-from"  # the session id


class AgentStatus(models.TextChoices):
    ALIVE = "ALIVE"
    LOST = "LOST"
    RESTARTING = "RESTARTING"
    TERMINATED = "TERMINATED"


class Agent(models.Model):
    id = models.CharField(max_length=64, primary_key=True)
    status = models.CharField(max_length=16, choices=AgentStatus, default=AgentStatus.ALIVE)
    scaling_group = models.ForeignKey(
        ScalingGroup, on_delete=models.PROTECT, related_name="agents"
    )
    schedulable = models.BooleanField(default=True)
    available_slots = SlotsField()
    occupied_slots = SlotsField()
    addr = models.CharField(max_length=128, blank=True)
    stream_addr = models.CharField(
        max_length=128, blank=True,
        help_text="host:port of its stream endpoint (terminals, apps), as its heartbeat says.")
    region = models.CharField(max_length=64, blank=True)
    architecture = models.CharField(max_length=32, default="x86_64")
    version = models.CharField(max_length=32, blank=True)
    first_contact = models.DateTimeField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    lost_at = models.DateTimeField(null=True, blank=True)
    docker_error = models.CharField(
        max_length=500, blank=True,
        help_text="The agent's last word on its Docker engine; empty when it answers.")
    containers = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="The containers its last heartbeat listed: kernel id, container id, state.")
    stopping = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="The kernels its last heartbeat said it is stopping or stopped a moment "
                  "ago (a stopped one's container may be gone before its report arrives).")
    swarm = models.JSONField(
        default=dict, blank=True, editable=False,
        help_text="Its Docker engine's swarm membership: state, node id, manager, the "
                  "managers it knows; `departed` lists node ids it no longer is.")
    networks = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="The session networks its last heartbeat listed: name, session id, driver.")
    kept = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="The stopped sessions' kernels its engine keeps, as its last heartbeat "
                  "listed them: [{kernel_id, container_id, volume, bytes}].")
    devices = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="Its accelerators, as its last heartbeat listed them: id, kind, plugin, "
                  "model, memory, NUMA node, the slots each offers, what kernels hold of "
                  "it, and its utilization and memory in use.")
    images = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="The kernel images its Docker engine holds, as its last heartbeat listed "
                  "them: the scheduler prefers agents that need no pull.")
    containers_at = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="When the agent took that list.")

    class Meta:
        indexes = [models.Index(fields=["scaling_group", "status"])]

    def __str__(self):
        return self.id

    def swarm_key_meets(self, key):
        own = swarm_key(self.swarm)
        return bool(own and own & key)

    @property
    def free_slots(self) -> ResourceSlots:
        return ResourceSlots.parse(self.available_slots) - ResourceSlots.parse(self.occupied_slots)


class WarmNetwork(models.Model):
    """An overlay network made ahead of time for the next session of its scaling group that
    spans hosts. Every swarm agent of the group attaches a holder container to it, so each
    engine has made its part of the network (the load-balancer sandbox and VXLAN device,
    ~0.5 s per engine) before a session needs it. A session placed across hosts claims one
    (`session_id`); its kernels' starts remove the holders, and it is removed with the
    session like a network made for it (agents_app/network_pool.py)."""
    name = models.CharField(max_length=80, primary_key=True)
    scaling_group = models.ForeignKey(ScalingGroup, on_delete=models.CASCADE,
                                      related_name="warm_networks")
    internal = models.BooleanField(help_text="No way out (the group allows no outbound).")
    session_id = models.UUIDField(null=True, blank=True, unique=True,
                                  help_text="The session that claimed it; none while warm.")
    claimed_at = models.DateTimeField(null=True, blank=True)
    retired = models.BooleanField(
        default=False, help_text="Unclaimed and no longer wanted (fewer wanted, or the "
                                 "group's outbound changed): removed, never claimed.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["scaling_group", "session_id"])]

    def __str__(self):
        return self.name


def resource_limits(labels):
    """(minimum, maximum) per kernel that an image's labels declare, as ResourceSlots; a
    slot without a label is not bounded. A label that is not a quantity is left out."""
    bounds = (ResourceSlots(), ResourceSlots())
    for key, value in (labels or {}).items():
        for prefix, slots in zip((MIN_LABEL, MAX_LABEL), bounds, strict=True):
            if key.startswith(prefix):
                name = key[len(prefix):]
                try:
                    slots.update(ResourceSlots.parse({name: value}))
                except SlotError as exc:
                    log.warning("image label %s=%r ignored: %s", key, value, exc)
    return bounds


class ImageQuerySet(models.QuerySet):
    def usable_by(self, user_id):
        """The images a user may see and start sessions from: every image but the ones
        committed from other users' sessions. `None`: every image (admins)."""
        if user_id is None:
            return self
        return self.filter(~models.Q(labels__has_key=OWNER_LABEL)
                           | models.Q(**{f"labels__{OWNER_LABEL}": f"user:{user_id}"}))


class Image(models.Model):
    name = models.CharField(max_length=255, help_text="For example bai-local/busybox:latest.")
    architecture = models.CharField(max_length=32, default="x86_64")
    registry = models.CharField(max_length=255, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    min_slots = SlotsField()  # what its ai.backend.resource.min.* labels ask for

    objects = ImageQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "architecture"], name="image_unique_per_arch")
        ]

    def __str__(self):
        return self.name


class HeartbeatWatch(models.Model):
    """When the manager could hear heartbeats (one row). An agent's silence counts only
    from `listening_since`: while the broker, the manager worker, beat or the database is
    away, no heartbeat can arrive, and that is no agent's fault."""

    last_sweep = models.DateTimeField(null=True)
    listening_since = models.DateTimeField(null=True)

    def __str__(self):
        return f"listening since {self.listening_since}"


def swarm_key(swarm):
    """Which swarm an agent's engine is in (the manager node ids it knows), or None when
    it is in none: two agents can hold one multi-host session when their keys meet."""
    if not swarm or swarm.get("state") != "active" or not swarm.get("managers"):
        return None
    return frozenset(swarm["managers"])
