"""The cost of running a kernel as an unprivileged user (issue 37): the one step it adds to
a start, `work-directory` (giving /home/work to the user), timed alone on the local Docker
engine, both ways the agent takes it (a chown where the engine is local and not remapped,
the engine's archive otherwise), beside the container's create. The end-to-end figure is
`make bench BENCH=agent` before and after (docs/benchmarks/agent.md, "The kernel's user")."""

import os
import statistics
import time
import uuid

LABELS = {"ai.backend.bench": "kernel-user"}
RUNS = 20


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    import django
    django.setup()
    from django.conf import settings

    from agents_app.runtime.docker_backend import connect
    from agents_app.runtime.provisioners import ScratchVolume, WorkDirectory

    image = settings.DEFAULT_KERNEL_IMAGE
    client = connect()
    times = {"create": [], "chown": [], "archive": []}
    for run in range(RUNS * 2):
        way = "chown" if run % 2 == 0 else "archive"
        scratch = ScratchVolume(client)
        volume = scratch.setup(str(uuid.uuid4()))
        started = time.perf_counter()
        container = client.containers.create(
            image, ["sleep", "1"], user="1000:1000", labels=LABELS,
            volumes={volume: {"bind": "/home/work", "mode": "rw"}})
        created = time.perf_counter()
        try:
            WorkDirectory().setup(container, (1000, 1000),
                                  scratch.mountpoint if way == "chown" else None)
            times[way].append(time.perf_counter() - created)
            times["create"].append(created - started)
            if way == "chown" and os.stat(scratch.mountpoint).st_uid != 1000:
                raise SystemExit("the chown was not taken (not root, or a remote engine)")
        finally:
            container.remove(force=True)
            scratch.teardown(volume)
    with open("/proc/loadavg") as load:
        print(f"load average {load.read().split()[0]}; {RUNS} kernels each way")
    for name, label in (("create", "container create (beside)"),
                        ("chown", "work-directory by chown"),
                        ("archive", "work-directory by the engine's archive")):
        values = times[name]
        print(f"{label:40} p50 {statistics.median(values) * 1000:8.3f} ms, "
              f"p95 {percentile(values, 0.95) * 1000:8.3f} ms")
    share = statistics.median(times["chown"]) / statistics.median(times["create"])
    print(f"chown p50 / create p50: {share:.5f}")
