"""Stop and resume at the agent (issue 31): for a kernel with 1 GiB written into its scratch
volume, the keeping stop, the resume on the same agent, and the move to a second Docker
engine (a dockerd in a network namespace, tests/live/two_hosts.py, no swarm), beside `cp`
of those bytes on the same disk and a fresh start of a kernel. p50 of REPEAT runs.

The agents' code runs as the agent process runs it (Agent, its stream endpoint), the source
agent's stream endpoint in a process of its own (as on another host), the target in this
one. Needs root and Docker; no database, Redis or manager. Opt-in: it starts a dockerd and
writes a few GiB. `make bench BENCH=resume` (`python -m bench resume`). The manager adds its
queue hops to these (a few tens of ms: tests/live/test_stop_resume_live.py runs the whole
path)."""

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPT_IN = True
REPEAT = int(os.environ.get("BENCH_RESUME_REPEAT", "5"))
SIZE_MIB = int(os.environ.get("BENCH_RESUME_MIB", "1024"))


def setup_django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def recording_agent(engine):
    from agents_app.runtime.agent import Agent

    class Recording(Agent):
        def __init__(self):
            super().__init__(f"bench-keep-{uuid.uuid4().hex[:6]}", "default")
            self.reports = []
            self._client = engine

        def report(self, kernel_id, event, **data):
            self.reports.append((kernel_id, event, data))

        def wait(self, kernel_id, event, timeout=600):
            ends = time.monotonic() + timeout
            while time.monotonic() < ends:
                for kernel, name, data in self.reports:
                    if kernel == kernel_id and name == event:
                        return data
                    if kernel == kernel_id and name == "creation_failed":
                        raise RuntimeError(f"{kernel_id}: {data}")
                time.sleep(0.005)
            raise TimeoutError(event)

    return Recording()


SOURCE_SERVER = """
import os, sys, time, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
django.setup()
from agents_app.runtime.agent import Agent
from agents_app.runtime.streams import StreamServer
server = StreamServer(Agent(sys.argv[1], "default"), "127.0.0.1:0").start()
print(server.address, flush=True)
sys.stdin.read()
"""


def spec_for(image, **extra):
    return {
        "session_id": str(uuid.uuid4()), "session_name": "bench-keep",
        "session_type": "interactive", "owner_user_id": "1", "startup_command": "",
        "environ": {}, "grace_period": 1, "cluster_size": 1, "pre_stop_command": "",
        "ssh_keypair": None, "pids_limit": None, "open_files_limit": None,
        "allow_outbound": True, "network_driver": "bridge", "network_name": None,
        "cluster_hosts": ["main1"], "mounts": [], "kernel_id": str(uuid.uuid4()),
        "image": image, "slots": {"cpu": "1", "mem": str(1024 * 2**20)},
        "bootstrap_script": "", "cluster_role": "main", "cluster_idx": 1,
        "cluster_hostname": "main1", **extra}


def timed(function, *args):
    """(seconds of function(*args), seconds of the sync after it, its result)."""
    os.sync()  # what an earlier step left dirty is not this step's to write
    started = time.perf_counter()
    result = function(*args)
    done = time.perf_counter()
    os.sync()
    return done - started, time.perf_counter() - started, result


def one_run(source, target, main_engine, image, scratch, rows, made):
    from agents_app import stream_tokens

    spec = spec_for(image)
    kid = spec["kernel_id"]
    made.append(spec)
    rows["fresh start"].append(timed(source.create_kernel, spec)[0])
    container = source.wait(kid, "kernel_started")["container_id"]
    kernel = main_engine.containers.get(container)
    written = kernel.exec_run(
        ["/bin/sh", "-c", f"head -c {SIZE_MIB * 2**20} /dev/urandom > /home/work/big"])
    assert written.exit_code == 0, written.output
    # Outside /home/work: root's (uid 0, no capabilities), not the kernel's user's.
    written = kernel.exec_run(["/bin/sh", "-c", "mkdir -p /usr/local/bin && "
                                                "echo tool > /usr/local/bin/t"], user="0")
    assert written.exit_code == 0, written.output
    source.reports.clear()

    def stop():
        source.stop_kernel(kid, container, "bench")
        source.wait(kid, "kernel_stopped")

    rows["keeping stop"].append(timed(stop)[0])
    source.reports.clear()
    rows["resume here"].append(timed(source.create_kernel,
                                     {**spec, "restore": {"from": "local"}})[0])
    source.wait(kid, "kernel_started")
    source.reports.clear()
    stop()

    volume = main_engine.volumes.get(f"bai-scratch-{kid}").attrs["Mountpoint"]
    copied, copied_synced, _ = timed(subprocess.run, ["cp", f"{volume}/big", scratch / "big"])
    (scratch / "big").unlink()
    token = stream_tokens.mint(agent_id=source.id, kernel_id=kid, container_id="",
                               target=f"kept:{kid}", ttl=600)
    moved, moved_synced, _ = timed(target.create_kernel, {
        **spec, "restore": {"from": source.id, "token": token,
                            "stream_addr": source.stream_addr}})
    started = target.wait(kid, "kernel_started")
    for name, value in (("move", moved), ("cp", copied), ("move / cp", moved / copied),
                        ("move + sync", moved_synced), ("cp + sync", copied_synced),
                        ("(move + sync) / (cp + sync)", moved_synced / copied_synced)):
        rows[name].append(value)
    print(f"fresh start {rows['fresh start'][-1]:.2f} s, keeping stop "
          f"{rows['keeping stop'][-1]:.2f} s, resume here {rows['resume here'][-1]:.2f} s, "
          f"move {moved:.2f} s ({started['restored_bytes'] / 2**20:.1f} MiB; "
          f"{moved_synced:.2f} s with sync), cp {copied:.2f} s ({copied_synced:.2f} s with "
          f"sync); steps {started['provision_seconds']}", flush=True)
    source.drop_kept(kid)
    target.destroy_kernel(kid, started["container_id"], "bench", forced=True)
    target.wait(kid, "kernel_terminated")
    target.reports.clear()
    source.reports.clear()
    return spec, started["restored_bytes"]


def main():
    setup_django()
    import docker
    from django.conf import settings

    from agents_app.runtime import docker_backend as backend
    from agents_app.runtime import networks
    from tests.live.two_hosts import SecondHost, tools_problem

    problem = tools_problem()
    if problem:
        print(f"skipped: {problem}")
        return
    image = settings.DEFAULT_KERNEL_IMAGE
    main_engine = docker.from_env(timeout=600)
    host = SecondHost(image, netns="k2", addresses=("10.201.0.1", "10.201.0.2"),
                      bip="172.30.0.1/16", swarm=False).up()
    second = docker.DockerClient(base_url=host.url, timeout=600)
    source, target = recording_agent(main_engine), recording_agent(second)
    server = subprocess.Popen([sys.executable, "-c", SOURCE_SERVER, source.id], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    source.stream_addr = server.stdout.readline().strip()
    scratch = Path(tempfile.mkdtemp(prefix="bench-keep-", dir=ROOT / "var"))
    rows = {name: [] for name in (
        "fresh start", "keeping stop", "resume here", "move", "cp", "move / cp",
        "move + sync", "cp + sync", "(move + sync) / (cp + sync)")}
    moved_bytes, made = [], []
    try:
        for run in range(REPEAT):
            print(f"run {run + 1}: ", end="", flush=True)
            moved_bytes.append(one_run(source, target, main_engine, image, scratch, rows,
                                       made)[1])
    finally:
        server.stdin.close()
        server.wait(30)
        shutil.rmtree(scratch, ignore_errors=True)
        for engine, agent in ((main_engine, source), (second, target)):
            for container in engine.containers.list(
                    all=True, filters={"label": f"{backend.AGENT_ID}={agent.id}"}):
                container.remove(force=True)
            for spec in made:  # what a run cut short left
                for volume in engine.volumes.list(
                        filters={"name": f"bai-scratch-{spec['kernel_id']}"}):
                    volume.remove(force=True)
                for network in engine.networks.list(
                        names=[networks.session_network_name(spec["session_id"])]):
                    network.remove()
                with contextlib.suppress(docker.errors.ImageNotFound):
                    engine.images.remove(backend.kept_image(spec["kernel_id"]), force=True)
        host.down()
    print(f"\n{SIZE_MIB} MiB written in the scratch volume; moved "
          f"{statistics.median(moved_bytes) / 2**20:.1f} MiB (p50); {REPEAT} runs")
    print("| step | p50 | p95 | min | max |")
    print("| --- | --- | --- | --- | --- |")
    for name, values in rows.items():
        unit = "" if "/" in name else " s"
        p95 = statistics.quantiles(values, n=20, method="inclusive")[-1] \
            if len(values) > 1 else values[0]
        print(f"| {name} | {statistics.median(values):.2f}{unit} | {p95:.2f}{unit} "
              f"| {min(values):.2f}{unit} | {max(values):.2f}{unit} |")


if __name__ == "__main__":
    main()
