"""The names of a session's world: statuses and their groups, session types, cluster modes,
results. Plain enums that any layer (and the agent process) may import without the models."""

import enum

from django.db import models


class Status(models.TextChoices):
    """Statuses of sessions and kernels alike."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    PREPARING = "PREPARING"
    PULLING = "PULLING"
    PREPARED = "PREPARED"
    CREATING = "CREATING"
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    CANCELLED = "CANCELLED"
    ERROR = "ERROR"
    # Stopped and kept (Kubeflow's culler scales a notebook to zero): no slot held, its
    # kernels' files kept on their agents until it is resumed, deleted or past retention.
    STOPPED = "STOPPED"


class StatusGroup(frozenset, enum.Enum):
    """Statuses by what they mean for a session's life. Each member is the frozenset of its
    statuses: `status in StatusGroup.LIVE`, `filter(status__in=StatusGroup.FINISHED)`."""

    FINISHED = {Status.TERMINATED, Status.CANCELLED}
    LIVE = set(Status) - {Status.TERMINATED, Status.CANCELLED}


class SessionType(models.TextChoices):
    INTERACTIVE = "interactive"
    BATCH = "batch"
    INFERENCE = "inference"


class ClusterMode(models.TextChoices):
    SINGLE_NODE = "single-node"
    MULTI_NODE = "multi-node"


class SessionResult(models.TextChoices):
    UNDEFINED = "undefined"
    SUCCESS = "success"
    FAILURE = "failure"
