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
    # Placed on an agent and on the way to RUNNING.
    STARTING = {Status.SCHEDULED, Status.PREPARING, Status.PULLING, Status.PREPARED,
                Status.CREATING}
    # A kernel holds its agent's slots from allocation until its container is gone; a
    # session in these counts against its policy's, project's and domain's totals.
    HOLDING_SLOTS = STARTING | {Status.RUNNING, Status.TERMINATING, Status.ERROR}
    # A session counts against its keypair's concurrency from allocation until its destroy
    # is accepted (Backend.AI releases concurrency then) or its main kernel fails (ERROR, or
    # ended); nothing takes it back afterwards: ERROR holds slots (its container may run)
    # but no concurrency, so TERMINATING → ERROR changes nothing.
    HOLDING_CONCURRENCY = STARTING | {Status.RUNNING}


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
