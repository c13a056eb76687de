"""What Docker's start of a kernel's container costs, option by option (issue 36): the
options the agent gives a kernel (provisioners.KernelContainer) added one group at a time
to a plain `init` container of the kernel image, each variant created and started RUNS
times in alternating order, beside raw `docker run -d --init` through the CLI (the
baseline of `make bench BENCH=agent`). The network variants use the agent's own bridge
(networks.create_session_network, made before the timer as a warm bridge is) and its
sandbox (networks.make_sandbox). Opt-in: `make bench BENCH=start_options`."""

import os
import statistics
import subprocess
import time
import uuid

OPT_IN = True
RUNS = int(os.environ.get("BENCH_RUNS", "15"))
LABELS = {"ai.backend.bench": "start-options"}
VARIANTS = {
    "docker run -d --init (CLI)": (),
    "plain (init, Docker's default bridge)": (),
    "+ resource limits": ("limits",),
    "+ hardening (user, caps, no-new-privileges, pids, nofile)": ("hardening",),
    "+ scratch volume": ("volume",),
    "+ labels, environment, hostname": ("meta",),
    "all of the above, default bridge": ("limits", "hardening", "volume", "meta"),
    "+ own bridge (made ahead)": ("bridge",),
    "+ own bridge and alias": ("bridge", "alias"),
    "the kernel: all, own bridge and alias": ("limits", "hardening", "volume", "meta",
                                              "bridge", "alias"),
    "the kernel: all, in its bridge's sandbox": ("limits", "hardening", "volume", "meta",
                                                 "sandbox"),
}


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    import django
    django.setup()
    from django.conf import settings
    from docker.models.containers import Container

    from agents_app.runtime import docker_backend as backend
    from agents_app.runtime import networks
    from agents_app.runtime.docker_backend import KEEPALIVE, command_started

    image = settings.DEFAULT_KERNEL_IMAGE
    client = backend.connect()
    command = ["/bin/sh", "-c", KEEPALIVE]
    spec = {"kernel_id": str(uuid.uuid4()), "session_id": str(uuid.uuid4()),
            "session_name": "bench", "owner_user_id": "1", "grace_period": 10,
            "session_type": "interactive", "cluster_role": "main", "cluster_idx": 1,
            "cluster_hostname": "main1", "cluster_size": 1, "slots": {
                "cpu": "0.5", "mem": str(64 * 2**20)}}

    def cli():
        started = time.perf_counter()
        made = subprocess.run(["docker", "run", "-d", "--init", "--label",
                               "ai.backend.bench=start-options", image, *command],
                              capture_output=True, text=True, check=True)
        took = time.perf_counter() - started
        client.api.remove_container(made.stdout.strip(), force=True)
        return {"total": took}

    def ours(groups):
        made, options = [], {"labels": dict(LABELS)}
        if "limits" in groups:
            options.update(backend.resource_limits(spec["slots"]))
        if "hardening" in groups:
            options.update(backend.hardening(spec))
        if "meta" in groups:
            options["labels"].update(backend.kernel_labels("bench", spec))
            options["environment"] = backend.kernel_environment(spec)
            options["hostname"] = spec["cluster_hostname"]
        if "volume" in groups:
            volume = client.volumes.create(f"bai-bench-{uuid.uuid4().hex[:12]}",
                                           labels=LABELS)
            made.append(volume)
            options["volumes"] = {volume.name: {"bind": "/home/work", "mode": "rw"}}
        if "bridge" in groups or "sandbox" in groups:
            key = uuid.uuid4()
            network = networks.create_session_network(
                client, f"bai-bench-{key.hex[:12]}", str(key), labels=LABELS)
            made.append(network)
            if "sandbox" in groups:
                sandbox = networks.make_sandbox(client, "bench", network.name, image)
                made.insert(0, client.containers.get(sandbox))
                options["network_mode"] = f"container:{sandbox}"
                options.pop("hostname", None)
            else:
                options["network"] = network.name
                if "alias" in groups:
                    options.update(networks.network_endpoint(spec, network.name,
                                                             client.api.api_version))
        try:
            started = time.perf_counter()
            container = client.containers.create(image, command, init=True, detach=True,
                                                 **options)
            created = time.perf_counter()
            container.start()
            ran = time.perf_counter()
            container.reload()
            inspected = time.perf_counter()
            if container.status != "running" or not command_started(container):
                raise SystemExit(f"{groups}: the kernel's command did not start")
            seen = time.perf_counter()
            container.remove(force=True)
        finally:
            for thing in made:  # the sandbox first, then what it is on
                thing.remove(**({"force": True} if isinstance(thing, Container) else {}))
        return {"create": created - started, "start": ran - created,
                "inspect": inspected - ran, "/proc": seen - inspected,
                "total": seen - started}

    times = {name: {} for name in VARIANTS}
    names = list(VARIANTS)
    for run in range(RUNS + 1):  # the first round warms up, and is not counted
        for name in (names if run % 2 else list(reversed(names))):
            took = cli() if name.endswith("(CLI)") else ours(VARIANTS[name])
            if run:
                for step, seconds in took.items():
                    times[name].setdefault(step, []).append(seconds)
    with open("/proc/loadavg") as load:
        print(f"load average {load.read().split()[0]}; {RUNS} of each, medians in ms")
    steps = ["create", "start", "inspect", "/proc", "total"]
    print(f"| variant | {' | '.join(steps)} |")
    print(f"| --- |{' --- |' * len(steps)}")
    for name in names:
        cells = [f"{statistics.median(times[name][s]) * 1000:.1f}" if s in times[name]
                 else "" for s in steps]
        print(f"| {name} | {' | '.join(cells)} |")
