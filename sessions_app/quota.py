"""What a keypair's resource policy still allows, for the create form to show and bound."""

from dataclasses import dataclass

from common.slots import ResourceSlots
from sessions_app.enums import StatusGroup
from sessions_app.models import Session


@dataclass
class Quota:
    policy_name: str
    total: ResourceSlots | None  # None: the policy sets no limit
    held: ResourceSlots
    max_sessions: int
    sessions_used: int

    @property
    def remaining(self):
        if self.total is None:
            return None
        # Through to_json: slot arithmetic keeps exact Decimals such as 3.0; a page shows 3.
        return ResourceSlots.parse((self.total - self.held).clamp_negative().to_json())

    @property
    def sessions_remaining(self):
        return max(self.max_sessions - self.sessions_used, 0)


def session_slots(session):
    """All kernels' slots of a session: what it occupies once placed, else what it asks."""
    if session.occupying_slots:
        return ResourceSlots.parse(session.occupying_slots)
    slots = ResourceSlots()
    for _ in range(session.cluster_size):
        slots = slots + session.requested_slots
    return slots


def quota_of(keypair):
    """The keypair's policy against its sessions' slots, counted as the scheduler counts."""
    policy = keypair.resource_policy
    held = ResourceSlots()
    for session in Session.objects.filter(keypair=keypair, status__in=StatusGroup.HOLDING_SLOTS):
        held = held + session_slots(session)
    total = ResourceSlots.parse(policy.total_resource_slots) or None
    return Quota(policy_name=policy.name, total=total, held=held,
                 max_sessions=policy.max_concurrent_sessions,
                 sessions_used=keypair.concurrency_used)
