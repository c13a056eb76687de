"""Prometheus metrics at /metrics, in the text format of the prometheus_client library.

Two sources, both read when Prometheus scrapes, so that one scrape of any web process
sees the whole system:
- the database: sessions by status, pending age, start-up times from the sessions'
  status history, agents and their slots;
- counters and histograms that the processes doing the work (manager workers, web
  processes, agents) add to in Redis, the one store they all reach: culls, retries,
  destroy refusals, scheduler passes, API requests, websocket connections, container
  starts. A Redis that does not answer loses those increments, never the work.
"""

import bisect
import json
import logging
import re
import time
from functools import lru_cache

import redis
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from backendai_web import redis_conn
from backendai_web.logs import RepeatedFailure

log = logging.getLogger(__name__)

PREFIX = "backendai"
KEY = "bai-metrics"  # Redis hashes KEY:<metric>[:bucket|:sum|:count], field = labels JSON

# Seconds: a local image starts in about a second, a pull takes minutes.
START_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# One step of a kernel's start: milliseconds for a volume, seconds for an app to listen.
PROVISION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# name → (help, label names); kept in Redis by count().
COUNTERS = {
    "culls": ("Sessions culled by idle checkers, by reason.", ("reason",)),
    "retries": ("Kernel stage retries (retried) and reschedules after the last try "
                "(rescheduled).", ("stage", "outcome")),
    "destroy_refusals": ("Destroy requests refused by the rules or a pre-destroy hook.",
                         ("status",)),
    "scheduler_sessions_placed": ("Sessions placed by scheduler passes.", ("scaling_group",)),
    "api_requests": ("HTTP requests by route, method and status.",
                     ("route", "method", "status")),
    "agent_container_starts": ("Kernel containers an agent started or failed to start.",
                               ("agent", "outcome")),
    "beat_tasks_sent": ("Periodic tasks sent by each beat process (host:pid); only the "
                        "active beat's grows.", ("beat",)),
}
# Kept in Redis by observe().
HISTOGRAMS = {
    "scheduler_pass_seconds": ("Duration of one scheduler pass over a scaling group.",
                               ("scaling_group",), PASS_BUCKETS),
    "agent_container_start_seconds": ("Time an agent took to set up a kernel (volume, "
                                      "network, container) and start it.", ("agent",),
                                      START_BUCKETS),
    "agent_provision_seconds": ("Time an agent took for one step of a kernel's start, by "
                                "provisioner (scratch-volume, container, readiness...).",
                                ("agent", "provisioner"), PROVISION_BUCKETS),
}
# Kept in Redis by add().
GAUGES = {
    "websocket_connections": ("Open websocket connections (/ws/events/), all web processes.",
                              ()),
}

_redis_failure = RepeatedFailure(log, "metrics not recorded, Redis did not answer")


@lru_cache(maxsize=1)
def _redis():
    return redis_conn.client(socket_timeout=1, socket_connect_timeout=1)


def _field(labels):
    return json.dumps(labels, sort_keys=True)


_retry_at = 0.0  # while Redis fails, try again only every 10 s: never slow every request


def _write(commands):
    global _retry_at
    if _redis_failure.failing and time.monotonic() < _retry_at:
        return
    try:
        pipe = _redis().pipeline(transaction=False)
        for command in commands:
            command(pipe)
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        _redis_failure.failed(exc)
        _retry_at = time.monotonic() + 10
        return
    _redis_failure.ok()


def count(name, amount=1, **labels):
    """Add to a counter that every process shares."""
    assert name in COUNTERS, name
    _write([lambda p: p.hincrbyfloat(f"{KEY}:{name}", _field(labels), amount)])


def add(name, amount, **labels):
    """Add to (or, negative, take from) a gauge that every process shares."""
    assert name in GAUGES, name
    _write([lambda p: p.hincrbyfloat(f"{KEY}:{name}", _field(labels), amount)])


def observe(name, value, **labels):
    """One observation of a histogram that every process shares."""
    observe_many(name, [(value, labels)])


def observe_many(name, observations):
    """Observations [(value, labels)] of one histogram, in one write."""
    _, _, buckets = HISTOGRAMS[name]
    increments = []
    for value, labels in observations:
        field = _field(labels)
        # The bucket an observation falls in; cumulated when read.
        le = buckets[bisect.bisect_left(buckets, value)] if value <= buckets[-1] else "+Inf"
        increments += [(f"{KEY}:{name}:bucket", _field([labels, le]), 1),
                       (f"{KEY}:{name}:sum", field, value),
                       (f"{KEY}:{name}:count", field, 1)]
    if increments:
        _write([lambda p: [p.hincrbyfloat(*increment) for increment in increments]])


class Timer:
    """`with Timer("scheduler_pass_seconds", scaling_group=...)` observes the duration."""

    def __init__(self, name, **labels):
        self.name, self.labels = name, labels

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        observe(self.name, time.perf_counter() - self.start, **self.labels)


def reset():
    """Forget what the processes counted (tests)."""
    client = _redis()
    keys = list(client.scan_iter(f"{KEY}:*"))
    if keys:
        client.delete(*keys)


# Reading, at scrape time.

def _hash(client, key):
    return {field.decode(): float(value) for field, value in client.hgetall(key).items()}


def redis_metrics():
    client = _redis()
    try:
        stored = {name: _hash(client, f"{KEY}:{name}") for name in [*COUNTERS, *GAUGES]}
        for name in HISTOGRAMS:
            for part in ("bucket", "sum", "count"):
                stored[f"{name}:{part}"] = _hash(client, f"{KEY}:{name}:{part}")
    except (redis.RedisError, OSError) as exc:
        log.warning("metrics kept in Redis not read: %s", exc)
        return
    for name, (text, label_names) in COUNTERS.items():
        family = CounterMetricFamily(f"{PREFIX}_{name}", text, labels=label_names)
        for field, value in sorted(stored[name].items()):
            labels = json.loads(field)
            family.add_metric([str(labels.get(n, "")) for n in label_names], value)
        yield family
    for name, (text, label_names) in GAUGES.items():
        family = GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=label_names)
        for field, value in sorted(stored[name].items()):
            labels = json.loads(field)
            family.add_metric([str(labels.get(n, "")) for n in label_names], max(value, 0))
        if not stored[name] and not label_names:
            family.add_metric([], 0)
        yield family
    for name, (text, label_names, buckets) in HISTOGRAMS.items():
        family = HistogramMetricFamily(f"{PREFIX}_{name}", text, labels=label_names)
        per_series = {}
        for field, value in stored[f"{name}:bucket"].items():
            labels, le = json.loads(field)
            per_series.setdefault(_field(labels), {})[str(le)] = value
        for field, total in sorted(stored[f"{name}:sum"].items()):
            labels = json.loads(field)
            in_bucket = per_series.get(field, {})
            cumulated, running = [], 0.0
            for bound in [*buckets, "+Inf"]:
                running += in_bucket.get(str(bound), 0.0)
                cumulated.append((str(float(bound)) if bound != "+Inf" else "+Inf", running))
            family.add_metric([str(labels.get(n, "")) for n in label_names], cumulated, total)
        yield family


class RequestCounter:
    """Middleware: count each request by its route pattern (not its path: ids would make
    a series per session), method and status."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        count("api_requests", route=route_of(request), method=request.method,
              status=str(response.status_code))
        return response


def route_of(request):
    """The URL pattern that answered, readable: `api/v1/sessions/<pk>/execute/`."""
    match = getattr(request, "resolver_match", None)
    if match is None or getattr(match.func, "__name__", "") == "not_found":
        return "unmatched"
    route = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"<\1>", match.route or "")
    return "/" + route.lstrip("^").rstrip("$")
