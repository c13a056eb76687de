"""A kernel's other operations on this agent, each a plain function of the agent: a restart
in place, `docker commit` of its container, its logs, a command run in it, and the
removal of a container whose kernel the manager does not know."""

import logging
import threading
import time

from docker.errors import DockerException, NotFound

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import images, services
from agents_app.runtime.runner import KernelRunner

log = logging.getLogger("agent")
COMMIT_REPORT_SECONDS = 1.0  # progress of a commit, while Docker works on it
NO_CONTAINER = "the kernel has no container on this agent"


def restart_kernel(agent, kernel_id, container_id="", grace_period=10):
    """docker restart: the same container, command and scratch volume, started anew."""
    agent.stops.destroying.add(kernel_id)  # its "die" event is not an exit
    try:
        container = backend.find_kernel_container(agent.docker, agent.id, kernel_id,
                                                  container_id)
        if container is None:
            agent.report(kernel_id, "kernel_restart_failed", error=NO_CONTAINER)
            return
        container.restart(timeout=max(int(grace_period), 0))
    except (DockerException, OSError) as exc:
        agent.report(kernel_id, "kernel_restart_failed", error=str(exc)[:500])
        return
    finally:
        agent.stops.destroying.discard(kernel_id)
    if backend.cluster_size(container) > 1:  # its sshd ended with the old processes
        try:
            services.start_sshd(container)
        except (DockerException, OSError) as exc:
            log.warning("kernel %s: sshd not started again: %s", kernel_id, exc)
    agent.report(kernel_id, "kernel_restarted", container_id=container.id)


def remove_dangling(agent, container_id):
    """A container with this agent's labels whose kernel the manager does not know."""
    try:
        container = agent.docker.containers.get(container_id)
    except NotFound:
        return
    if backend.is_kept(container):  # only a resume or a drop touches a kept kernel
        log.warning("not removing kept container %s as dangling", container.name)
        return
    log.warning("removing dangling container %s (%s)", container.name, container_id[:12])
    agent.stops.destroying.add(container.labels.get(backend.KERNEL_ID, ""))
    KernelRunner.from_container(agent.docker, agent.id, container).teardown(forced=True)


def commit_kernel(agent, kernel_id, container_id, task_id, image, labels):
    """Save the kernel's container as `image` (docker commit, sessions_app/commits.py):
    reports commit_progress every COMMIT_REPORT_SECONDS while Docker works, then
    commit_done with the image's labels, or commit_failed."""
    container = backend.find_kernel_container(agent.docker, agent.id, kernel_id,
                                              container_id)
    if container is None:
        agent.report(kernel_id, "commit_failed", task_id=task_id, error=NO_CONTAINER)
        return
    started, done = time.monotonic(), threading.Event()

    def progress():
        # Docker measures the layer by walking it: beside the commit, not before it.
        what = f"committing {_megabytes(images.writable_size(agent.docker, container.id))}" \
               f" written in the kernel as {image}"
        while not done.wait(COMMIT_REPORT_SECONDS):
            agent.report(kernel_id, "commit_progress", task_id=task_id, current=1,
                         message=f"{what}: {time.monotonic() - started:.0f} s")

    agent.report(kernel_id, "commit_progress", task_id=task_id, current=0,
                 message=f"committing the kernel as {image}")
    threading.Thread(target=progress, name=f"commit-{task_id[:8]}", daemon=True).start()
    try:
        committed = images.commit_container(container, image, labels)
    except Exception as exc:  # whatever it was, the task must not wait for ever
        log.warning("commit of kernel %s as %s failed: %s", kernel_id, image, exc)
        agent.report(kernel_id, "commit_failed", task_id=task_id, error=str(exc)[:500])
        return
    finally:
        done.set()
    agent.report(kernel_id, "commit_done", task_id=task_id, image=image,
                 image_id=committed.id, labels=committed.labels,
                 size=committed.attrs.get("Size"),
                 seconds=round(time.monotonic() - started, 3))


def _megabytes(size):
    return "?" if size is None else f"{size / 1e6:.0f} MB"


def logs(agent, kernel_id, container_id="", tail=2000):
    container = backend.find_kernel_container(agent.docker, agent.id, kernel_id,
                                              container_id, kept=True)
    if container is None:
        return None
    return container.logs(tail=tail).decode("utf-8", "replace")


def execute(agent, kernel_id, container_id, command, timeout=30):
    container = backend.find_kernel_container(agent.docker, agent.id, kernel_id,
                                              container_id)
    if container is None:
        return {"error": NO_CONTAINER}
    result = container.exec_run(["timeout", str(int(timeout)), "/bin/sh", "-c", command],
                                demux=True)
    stdout, stderr = result.output or (b"", b"")
    return {"exit_code": result.exit_code,
            "stdout": (stdout or b"").decode("utf-8", "replace")[-65536:],
            "stderr": (stderr or b"").decode("utf-8", "replace")[-65536:]}
