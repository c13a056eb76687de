"""Sessions in any status, reached through the engine's own transitions."""

from agents_app.models import Agent, Image
from common import clock
from identity_app.keypairs import main_keypair
from scheduling_app.models import ScalingGroup
from sessions_app import engine
from sessions_app.enums import Status
from sessions_app.lifecycle.create import create_session

S = Status
# The path a kernel takes to each status.
PATHS = {
    S.PENDING: [],
    S.SCHEDULED: [S.SCHEDULED],
    S.PREPARING: [S.SCHEDULED, S.PREPARING],
    S.PULLING: [S.SCHEDULED, S.PREPARING, S.PULLING],
    S.PREPARED: [S.SCHEDULED, S.PREPARING, S.PREPARED],
    S.CREATING: [S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING],
    S.RUNNING: [S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING, S.RUNNING],
    S.TERMINATING: [S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING, S.RUNNING,
                    S.TERMINATING],
    S.ERROR: [S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING, S.RUNNING, S.ERROR],
    S.TERMINATED: [S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING, S.RUNNING,
                   S.TERMINATED],
    S.CANCELLED: [S.CANCELLED],
    S.STOPPED: [S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING, S.RUNNING, S.TERMINATING,
                S.STOPPED],
}


def make_agent(agent_id="agent-1", slots=None, group="default", **fields):
    """An ALIVE agent, which reports the default kernel image as installed."""
    Image.objects.get_or_create(name="bai-local/busybox:latest")
    fields.setdefault("last_heartbeat", clock.now())
    return Agent.objects.create(
        id=agent_id, scaling_group=ScalingGroup.objects.get_or_create(name=group)[0],
        available_slots=slots or {"cpu": "4", "mem": "8g"}, occupied_slots={}, **fields,
    )


def make_session(user, status=S.PENDING, *, agent=None, name="s1", cluster_size=1,
                 resources=None, **kwargs):
    session = create_session(keypair=main_keypair(user), user=user, name=name,
                             image="bai-local/busybox:latest", cluster_size=cluster_size,
                             resources=resources or {"cpu": "1", "mem": "256m"}, **kwargs)
    for kernel in session.kernels.all():
        walk(kernel, status, agent)
    session.refresh_from_db()
    return session


def walk(kernel, status, agent=None):
    for step in PATHS[status]:
        if step == S.SCHEDULED:
            agent = agent or Agent.objects.first() or make_agent()
            assert engine.schedule_kernel(kernel, agent)
            agent.refresh_from_db()
        elif step == S.RUNNING:
            assert engine.mark_kernel_running(kernel, {"container_id": f"c-{kernel.pk.hex}"})
        elif step == S.STOPPED:  # stopped, its files kept by its agent
            assert engine.transition_kernel(
                kernel, step, reason="test", kept_on=kernel.agent_id,
                kept={"container_id": kernel.container_id,
                      "volume": f"bai-scratch-{kernel.pk}", "bytes": 1000})
        else:
            assert engine.transition_kernel(kernel, step, reason="test")
    kernel.refresh_from_db()
    return kernel
