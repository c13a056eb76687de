"""Manager → agent calls: Celery tasks routed to the agent's own queue.

Call these only after commit (transaction.on_commit): an agent must never act on a
status that could still roll back.
"""


from agents_app import stream_tokens
from agents_app.models import Agent, AgentStatus, WarmNetwork, swarm_key
from backendai_web.celery import agent_queue, app, send_task_safely
from sessions_app.models import Session
from storage_app.folders import mount_specs


def _send(agent_id, task, **kwargs):
    return send_task_safely(task, kwargs=kwargs, queue=agent_queue(agent_id))


def send_check_and_pull(kernel):
    return _send(kernel.agent_id, "agent.check_and_pull", kernel_id=str(kernel.pk),
                 image=kernel.image)


def session_spec(session):
    """What every kernel of the session is started with: read once for all of them."""
    # The containers' limits and network, in one read.
    pids, open_files, outbound, uid, gid = Session.objects.filter(pk=session.pk).values_list(
        "keypair__resource_policy__kernel_pids_limit",
        "keypair__resource_policy__kernel_open_files_limit",
        "scaling_group__allow_outbound", "scaling_group__kernel_uid",
        "scaling_group__kernel_gid").get()
    overlay = spans_hosts(session)
    return {
        "session_id": str(session.pk),
        "session_name": session.name,
        "session_type": session.session_type,
        "owner_user_id": str(session.user_id),
        "startup_command": session.startup_command,
        "environ": session.environ or {},
        "grace_period": session.grace_seconds,
        "cluster_size": session.cluster_size,
        "pre_stop_command": session.pre_stop_command,
        "ssh_keypair": session.cluster_ssh or None,
        "pids_limit": pids,
        "open_files_limit": open_files,
        "allow_outbound": outbound,
        "kernel_uid": uid,
        "kernel_gid": gid,
        "network_driver": "overlay" if overlay else "bridge",
        "network_name": warm_network_name(session.pk) if overlay else None,
        "cluster_hosts": cluster_hosts(session),
        "mounts": mount_specs(session.pk),
    }


def kernel_spec(kernel, session_part=None):
    """What the agent needs to start the kernel's container (`session_part`: the
    session_spec of its session, when the caller has it)."""
    session = kernel.session
    return {
        **(session_part or session_spec(session)),
        "kernel_id": str(kernel.pk),
        "image": kernel.image,
        "slots": kernel.occupied_slots or kernel.requested_slots,
        # The scheduler's plan of its devices: the agent takes it when they are free there.
        "device_allocation": kernel.device_allocation or {},
        # Run once, in the main kernel only (Backend.AI's bootstrap.sh).
        "bootstrap_script": session.bootstrap_script if kernel.is_main else "",
        "cluster_role": kernel.cluster_role,
        "cluster_idx": kernel.cluster_idx,
        "cluster_hostname": kernel.cluster_hostname,
        **({"restore": restore} if (restore := restore_spec(kernel)) else {}),
    }


def cluster_hosts(session):
    """The cluster hostnames of the session's kernels, main first (Backend.AI's order)."""
    if session.cluster_size == 1:
        return ["main1"]
    return [f"{role}{idx}" for role, idx in session.kernels.order_by(
        "cluster_role", "cluster_idx").values_list("cluster_role", "cluster_idx")]


def warm_network_name(session_id):
    """The warm overlay network the session claimed (agents_app/network_pool.py), or None:
    its overlay, if it has one, is then named after it (made when it is placed)."""
    return WarmNetwork.objects.filter(session_id=session_id).values_list(
        "name", flat=True).first()


def spans_hosts(session):
    """Its kernels are placed on more than one agent: they meet on an overlay network."""
    return session.cluster_size > 1 and session.kernels.exclude(agent=None).values(
        "agent").distinct().count() > 1


def send_create_kernels(kernels):
    """Ask each kernel's agent to make its container (kernels of one session); a multi-host
    session's overlay network first, asked for once for all of them (each ask is a round
    trip to a manager agent). {kernel id: error} of the kernels not sent: every one when
    the network cannot be made, else none."""
    if not kernels:
        return {}
    session = kernels[0].session
    common = session_spec(session)
    if common["network_driver"] == "overlay":
        error = ensure_session_network(session, internal=not common["allow_outbound"])
        if error:
            return {kernel.pk: f"session network: {error}" for kernel in kernels}
    for kernel in kernels:
        _send(kernel.agent_id, "agent.create_kernel", spec=kernel_spec(kernel, common))
    return {}


NETWORK_CALL_WAIT = 30  # seconds for a manager agent to make an overlay network


def network_agent(session):
    """The agent that makes and removes a multi-host session's overlay network: a swarm
    manager, one of the session's own agents if one is, else any ALIVE manager agent of
    the scaling group in the same swarm. None when there is none."""
    own = set(session.kernels.exclude(agent=None).values_list("agent_id", flat=True))
    return manager_agent(session.scaling_group_id, own)


def manager_agent(group_id, own=()):
    """An ALIVE agent of the group whose engine is a swarm manager, one of `own` if one
    is, in the swarm of all of `own` (the first by id when `own` is empty)."""
    managers = [a for a in Agent.objects.filter(
        scaling_group_id=group_id, status=AgentStatus.ALIVE,
        swarm__manager=True).order_by("id") if swarm_key(a.swarm)]
    keys = [swarm_key(a.swarm) for a in Agent.objects.filter(pk__in=own)]
    keys = [k for k in keys if k]
    for agent in sorted(managers, key=lambda a: a.pk not in own):
        if all(agent.swarm_key_meets(k) for k in keys):
            return agent
    return None


def send_create_network(session_ids):
    """Placed across hosts: the overlay network is made while the images are checked, so
    that the start finds it there (the start asks again and waits: this may be lost)."""
    for session in Session.objects.filter(pk__in=session_ids).select_related(
            "scaling_group"):
        agent = network_agent(session)
        if agent is not None:
            _send(agent.pk, "agent.create_network", session_id=str(session.pk),
                  internal=not session.scaling_group.allow_outbound)


def ensure_session_network(session, *, internal=False):
    """Ask the network agent to make the session's overlay network (it keeps one that
    exists) and wait for its answer: the error text, or None when the network is there.
    Every kernel's start asks, so a retried or re-sent start finds it too."""
    agent = network_agent(session)
    if agent is None:
        return "no ALIVE swarm manager agent to make the overlay network"
    try:
        warm = warm_network_name(session.pk)  # made by name, as a warm network is
        answer = call(agent.pk, "agent.create_network", NETWORK_CALL_WAIT, from_task=True,
                      session_id=None if warm else str(session.pk), internal=internal,
                      name=warm)
    except Exception as exc:  # the broker, or no answer in time
        return f"agent {agent.pk} did not make the network: {exc or type(exc).__name__}"
    return (answer or {}).get("error")


def departed_swarm_nodes():
    """Swarm node ids that agents' engines used to be and no longer are."""
    return sorted({n for swarm in Agent.objects.values_list("swarm", flat=True)
                   for n in (swarm or {}).get("departed", [])})


def send_remove_network(session_id, agent_id=None, session=None, name=None):
    """Ask for the removal of a session's network: of `agent_id`'s engine (a bridge it
    still lists), or of the swarm (the overlay, through a manager agent; the warm network
    it claimed, if it did). `name`: a warm network's, when the caller knows it."""
    if agent_id is None:
        agent = network_agent(session)
        if agent is None:
            return None  # heartbeats ask again once a manager agent reports it
        agent_id = agent.pk
        name = name or warm_network_name(session_id)
    return _send(agent_id, "agent.remove_network",
                 session_id=str(session_id) if session_id else None,
                 departed_nodes=departed_swarm_nodes(), name=name)


def send_create_warm_network(agent_id, name, internal):
    return _send(agent_id, "agent.create_network", name=name, internal=internal)


def send_hold_network(agent_id, name, image):
    return _send(agent_id, "agent.hold_network", name=name, image=image)


def send_release_network(agent_id, name):
    return _send(agent_id, "agent.release_network", name=name)


def call(agent_id, task, wait, *, from_task=False, **kwargs):
    """A manager → agent call that waits up to `wait` seconds for the answer. From
    inside a manager task (`from_task`) Celery must be told that the wait is meant: the
    agent's task never waits for a manager task in turn, so it cannot deadlock."""

    result = app.send_task(task, kwargs=kwargs, queue=agent_queue(agent_id))
    try:
        return result.get(timeout=wait, disable_sync_subtasks=not from_task)
    finally:
        result.forget()


def send_remove_dangling(agent_id, container_id):
    return _send(agent_id, "agent.remove_dangling", container_id=container_id)


def send_destroy_kernel(kernel, reason, *, forced=False):
    """Stop the kernel's container: gracefully, or (forced) SIGKILL at once, no hook."""
    return _send(kernel.agent_id, "agent.destroy_kernel", kernel_id=str(kernel.pk),
                 container_id=kernel.container_id, reason=reason, forced=forced)


def send_commit_kernel(kernel, task_id, image, labels):
    return _send(kernel.agent_id, "agent.commit_kernel", kernel_id=str(kernel.pk),
                 container_id=kernel.container_id, task_id=task_id, image=image,
                 labels=labels)


def send_stop_kernel(kernel, reason):
    """Stop the kernel's container gracefully and keep it, with its scratch volume (the
    session is being stopped: sessions_app.lifecycle.stop)."""
    return _send(kernel.agent_id, "agent.stop_kernel", kernel_id=str(kernel.pk),
                 container_id=kernel.container_id, reason=reason)


def send_drop_kept(agent_id, kernel_id):
    """Remove what `agent_id` keeps of a stopped kernel (its container, image, volume)."""
    return _send(agent_id, "agent.drop_kept", kernel_id=str(kernel_id))


def restore_spec(kernel):
    """How the kernel's agent gets back its kept files on a resume: its own stopped
    container, or a move from the agent that keeps them (with a token for that agent's
    stream endpoint); None for a kernel that keeps nothing."""
    if not kernel.kept_on:
        return None
    if kernel.kept_on == kernel.agent_id:
        return {"from": "local"}
    source = Agent.objects.filter(pk=kernel.kept_on).values_list("stream_addr", flat=True)
    token = stream_tokens.mint(agent_id=kernel.kept_on, kernel_id=kernel.pk,
                               container_id="", target=f"kept:{kernel.pk}",
                               ttl=KEPT_TOKEN_TTL)
    return {"from": kernel.kept_on, "stream_addr": source.first() or "", "token": token}


KEPT_TOKEN_TTL = 900  # seconds: a move starts once its create task is taken


def send_restart_kernel(kernel):
    return _send(kernel.agent_id, "agent.restart_kernel", kernel_id=str(kernel.pk),
                 container_id=kernel.container_id, grace_period=kernel.session.grace_seconds)
