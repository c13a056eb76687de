from django.db import models

from scheduling_app.models import ScalingGroup, SlotsField
from scheduling_app.slots import ResourceSlots


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
    region = models.CharField(max_length=64, blank=True)
    architecture = models.CharField(max_length=32, default="x86_64")
    version = models.CharField(max_length=32, blank=True)
    first_contact = models.DateTimeField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    lost_at = models.DateTimeField(null=True, blank=True)
    docker_error = models.CharField(
        max_length=500, blank=True,
        help_text="The agent's last word on its Docker engine; empty when it answers.")

    class Meta:
        indexes = [models.Index(fields=["scaling_group", "status"])]

    def __str__(self):
        return self.id

    @property
    def free_slots(self) -> ResourceSlots:
        return ResourceSlots.parse(self.available_slots) - ResourceSlots.parse(self.occupied_slots)


class Image(models.Model):
    name = models.CharField(max_length=255, help_text="For example bai-local/busybox:latest.")
    architecture = models.CharField(max_length=32, default="x86_64")
    registry = models.CharField(max_length=255, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    min_slots = SlotsField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "architecture"], name="image_unique_per_arch")
        ]

    def __str__(self):
        return self.name
