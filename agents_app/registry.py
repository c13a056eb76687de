"""Manager side of heartbeats: the Agent rows and the Image rows they report."""

from django.db import transaction

from scheduling_app.models import ScalingGroup
from sessions_app import clock

from .models import Agent, AgentStatus, Image


@transaction.atomic
def handle_heartbeat(info):
    now = clock.now()
    group, _ = ScalingGroup.objects.get_or_create(name=info.get("scaling_group") or "default")
    agent = Agent.objects.select_for_update().filter(pk=info["id"]).first()
    became_alive = agent is None or agent.status != AgentStatus.ALIVE
    fields = {
        "scaling_group": group,
        "available_slots": info.get("slots", {}),
        "addr": info.get("addr", ""),
        "region": info.get("region", ""),
        "architecture": info.get("architecture", "x86_64"),
        "version": info.get("version", ""),
        "last_heartbeat": now,
    }
    if agent is None:
        agent = Agent.objects.create(id=info["id"], status=AgentStatus.ALIVE, first_contact=now,
                                     **fields)
    else:
        for name, value in fields.items():
            setattr(agent, name, value)
        if agent.status != AgentStatus.ALIVE:
            agent.status, agent.lost_at = AgentStatus.ALIVE, None
        agent.save()
    for image in info.get("images", []):
        Image.objects.update_or_create(
            name=image["name"], architecture=agent.architecture,
            defaults={"labels": image.get("labels", {})},
        )
    if became_alive:
        from sessions_app.services import kick_scheduler

        transaction.on_commit(lambda: kick_scheduler(group.name))
    return agent


def mark_agent_terminated(agent_id):
    Agent.objects.filter(pk=agent_id).update(status=AgentStatus.TERMINATED, schedulable=True)
