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
import hmac
import json
import logging
import re
import time
from functools import lru_cache

from django.conf import settings
from django.db.models import Count, Min
from django.http import HttpResponse, JsonResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from backendai_web.logs import RepeatedFailure

log = logging.getLogger(__name__)

PREFIX = "backendai"
KEY = "bai-metrics"  # Redis hashes KEY:<metric>[:bucket|:sum|:count], field = labels JSON

# Seconds: a local image starts in about a second, a pull takes minutes.
START_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

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
}
# Kept in Redis by observe().
HISTOGRAMS = {
    "scheduler_pass_seconds": ("Duration of one scheduler pass over a scaling group.",
                               ("scaling_group",), PASS_BUCKETS),
    "agent_container_start_seconds": ("Time an agent took to set up a kernel (volume, "
                                      "network, container) and start it.", ("agent",),
                                      START_BUCKETS),
}
# Kept in Redis by add().
GAUGES = {
    "websocket_connections": ("Open websocket connections (/ws/events/), all web processes.",
                              ()),
}

_redis_failure = RepeatedFailure(log, "metrics not recorded, Redis did not answer")


@lru_cache(maxsize=1)
def _redis():
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)


def _field(labels):
    return json.dumps(labels, sort_keys=True)


_retry_at = 0.0  # while Redis fails, try again only every 10 s: never slow every request


def _write(commands):
    global _retry_at
    import redis

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
    _, _, buckets = HISTOGRAMS[name]
    field = _field(labels)
    # The bucket an observation falls in; cumulated when read.
    le = buckets[bisect.bisect_left(buckets, value)] if value <= buckets[-1] else "+Inf"
    _write([lambda p: p.hincrbyfloat(f"{KEY}:{name}:bucket", _field([labels, le]), 1),
            lambda p: p.hincrbyfloat(f"{KEY}:{name}:sum", field, value),
            lambda p: p.hincrbyfloat(f"{KEY}:{name}:count", field, 1)])


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
    import redis

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


def _histogram(name, text, label_names, samples, buckets):
    """A histogram of (labels tuple, value) samples."""
    family = HistogramMetricFamily(f"{PREFIX}_{name}", text, labels=label_names)
    series = {}
    for labels, value in samples:
        series.setdefault(labels, []).append(value)
    for labels, values in sorted(series.items()):
        values.sort()
        cumulated = [(str(float(b)), bisect.bisect_right(values, b)) for b in buckets]
        cumulated.append(("+Inf", len(values)))
        family.add_metric(list(labels), cumulated, sum(values))
    return family


# Phases of a start, from the session's status history: (name, from, to).
PHASES = (("queued", "PENDING", "SCHEDULED"), ("preparing", "SCHEDULED", "PREPARED"),
          ("pulling", "PULLING", "PREPARED"), ("creating", "PREPARED", "RUNNING"))


def _seconds(history, start, end):
    from datetime import datetime

    if start not in history or end not in history:
        return None
    seconds = (datetime.fromisoformat(history[end])
               - datetime.fromisoformat(history[start])).total_seconds()
    return seconds if seconds >= 0 else None  # a rescheduled session went back to PENDING


def database_metrics():
    from agents_app.models import Agent
    from common import clock
    from common.slots import ResourceSlots
    from sessions_app.models import Session, Status

    family = GaugeMetricFamily(f"{PREFIX}_sessions", "Sessions by status and scaling group.",
                               labels=("status", "scaling_group"))
    for row in (Session.objects.order_by().values("status", "scaling_group__name")
                .annotate(n=Count("id"))):
        family.add_metric([row["status"], row["scaling_group__name"]], row["n"])
    yield family

    now = clock.now()
    family = GaugeMetricFamily(f"{PREFIX}_pending_oldest_age_seconds",
                               "Age of the oldest PENDING session, by scaling group.",
                               labels=("scaling_group",))
    for row in (Session.objects.filter(status=Status.PENDING).order_by()
                .values("scaling_group__name").annotate(oldest=Min("created_at"))):
        family.add_metric([row["scaling_group__name"]],
                          (now - row["oldest"]).total_seconds())
    yield family

    started = list(Session.objects.filter(starts_at__isnull=False).order_by()
                   .values_list("scaling_group__name", "created_at", "starts_at",
                                "status_history"))
    yield _histogram("session_start_seconds",
                     "Time from PENDING (creation) to RUNNING of sessions that started.",
                     ("scaling_group",),
                     [((group,), (starts - created).total_seconds())
                      for group, created, starts, _ in started], START_BUCKETS)
    samples = []
    for group, _, _, history in started:
        for phase, start, end in PHASES:
            seconds = _seconds(history or {}, start, end)
            if seconds is not None:
                samples.append(((group, phase), seconds))
    yield _histogram("session_phase_seconds",
                     "Time spent in each phase of a start (queued: PENDING to SCHEDULED, "
                     "preparing: to PREPARED, pulling: PULLING to PREPARED, creating: "
                     "PREPARED to RUNNING).", ("scaling_group", "phase"), samples,
                     START_BUCKETS)

    agents = list(Agent.objects.order_by("id").values_list(
        "id", "status", "scaling_group__name", "available_slots", "occupied_slots"))
    family = GaugeMetricFamily(f"{PREFIX}_agents", "Agents by status and scaling group.",
                               labels=("status", "scaling_group"))
    by_status = {}
    for _, status, group, _, _ in agents:
        by_status[(status, group)] = by_status.get((status, group), 0) + 1
    for (status, group), n in sorted(by_status.items()):
        family.add_metric([status, group], n)
    yield family
    for kind, index in (("available", 3), ("occupied", 4)):
        family = GaugeMetricFamily(
            f"{PREFIX}_agent_{kind}_slots",
            f"Each agent's {kind} slots (cpu: cores, mem: bytes).",
            labels=("agent", "scaling_group", "status", "slot"))
        for row in agents:
            for slot, value in ResourceSlots.parse(row[index] or {}).items():
                family.add_metric([row[0], row[2], row[1], slot], float(value))
        yield family


class Collector:
    def collect(self):
        yield from database_metrics()
        yield from redis_metrics()


def exposition():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry)


# The endpoint.

def _refusal(request):
    """None when the request may read the metrics, else (status, message)."""
    from rest_framework.exceptions import AuthenticationFailed
    from rest_framework.request import Request

    from sessions_app.api.authentication import KeypairSignatureAuthentication
    from sessions_app.keypairs import is_admin, main_keypair

    header = request.META.get("HTTP_AUTHORIZATION", "")
    if header.startswith("Bearer "):
        token = settings.METRICS_TOKEN
        if token and hmac.compare_digest(header[len("Bearer "):].encode(), token.encode()):
            return None
        return 401, "The metrics token does not match."
    user, keypair = request.user, None
    if header.startswith(KeypairSignatureAuthentication.keyword + " "):
        try:
            user, keypair = KeypairSignatureAuthentication().authenticate(Request(request))
        except AuthenticationFailed as exc:
            return 401, str(exc.detail)
    if not user.is_authenticated:
        return 401, ("Send the metrics token (Authorization: Bearer METRICS_TOKEN) or "
                     "authenticate as an administrator.")
    if not is_admin(user, keypair or main_keypair(user)):
        return 403, "Only administrators and the metrics token may read the metrics."
    return None


def metrics_view(request):
    from sessions_app.api.errors import error_body

    refusal = _refusal(request)
    if refusal is not None:
        status, message = refusal
        response = JsonResponse(error_body(status, message), status=status)
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    # 0.0.4: the text format every Prometheus reads (Debian 12 ships 2.42).
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_PLAIN_0_0_4)


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
