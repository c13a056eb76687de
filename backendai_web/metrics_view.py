"""The operators' /metrics endpoint: what the database says at scrape time (sessions by status,
phase durations, agents and their slots) beside the counters every process keeps in Redis
(backendai_web.metrics), in Prometheus' text format; for the metrics token or an admin."""

import bisect
import hmac
from datetime import datetime
from decimal import Decimal

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
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from agents_app.models import Agent
from backendai_web.metrics import PREFIX, START_BUCKETS, redis_metrics
from common import clock
from common.slots import ResourceSlots
from identity_app.acting import actor_for
from identity_app.api.authentication import KeypairSignatureAuthentication
from sessions_app.api.errors import error_body
from sessions_app.enums import Status
from sessions_app.models import Kernel, Session
from sessions_app.series import device_utilization


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
PHASES = (("queued", Status.PENDING, Status.SCHEDULED),
          ("preparing", Status.SCHEDULED, Status.PREPARED),
          ("pulling", Status.PULLING, Status.PREPARED),
          ("creating", Status.PREPARED, Status.RUNNING))


def _seconds(history, start, end):

    if start not in history or end not in history:
        return None
    seconds = (datetime.fromisoformat(history[end])
               - datetime.fromisoformat(history[start])).total_seconds()
    return seconds if seconds >= 0 else None  # a rescheduled session went back to PENDING


def database_metrics():
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
    yield from device_metrics()
    yield from kernel_metrics()


# Each device's last measures, as its agent's heartbeat reported them: (name, key, help).
DEVICE_GAUGES = (
    ("device_utilization_percent", "utilization", "Each device's utilization, percent."),
    ("device_memory_used_bytes", "mem_used", "Each device's memory in use, bytes."),
    ("device_memory_total_bytes", "mem_total", "Each device's memory, bytes."),
    ("device_held_amount", None, "How much of each device its kernels hold (1: all of it)."),
)


def device_metrics():
    rows = list(Agent.objects.exclude(devices=[]).order_by("id").values_list(
        "id", "scaling_group__name", "devices"))
    for name, key, text in DEVICE_GAUGES:
        family = GaugeMetricFamily(f"{PREFIX}_{name}", text,
                                   labels=("agent", "scaling_group", "kind", "device", "model"))
        for agent, group, devices in rows:
            for device in devices or []:
                labels = [agent, group, str(device.get("kind")), str(device.get("id")),
                          str(device.get("model", ""))]
                if key is None:
                    family.add_metric(labels, float(sum(
                        Decimal(str(h.get("amount", 0))) for h in device.get("held") or [])))
                elif device.get(key) is not None:
                    family.add_metric(labels, float(device[key]))
        yield family


# Each RUNNING kernel's last sample (only running ones: a series per kernel that ever ran
# would grow without end): (name, key in the sample, counter?, help).
KERNEL_SERIES = (
    ("kernel_cpu_percent", "cpu_percent", False, "A kernel's CPU use, percent of one core."),
    ("kernel_cpu_seconds_total", "cpu_seconds", True, "A kernel's CPU time, seconds."),
    ("kernel_memory_bytes", "mem_bytes", False, "A kernel's memory use, bytes."),
    ("kernel_network_rx_bytes_total", "net_rx", True, "Bytes a kernel received."),
    ("kernel_network_tx_bytes_total", "net_tx", True, "Bytes a kernel sent."),
    ("kernel_block_read_bytes_total", "blk_read", True, "Bytes a kernel read from disks."),
    ("kernel_block_write_bytes_total", "blk_write", True, "Bytes a kernel wrote to disks."),
    ("kernel_device_utilization_percent", None, False,
     "Mean utilization of the devices a kernel holds, percent."),
)
KERNEL_LABELS = ("session_id", "kernel_id", "access_key", "user", "project",
                 "scaling_group", "agent")


def kernel_metrics():
    rows = list(Kernel.objects.filter(status=Status.RUNNING).exclude(last_stat={}).values_list(
        "session_id", "id", "session__keypair_id", "session__user__username",
        "session__project__name", "session__scaling_group__name", "agent_id", "last_stat"))
    for name, key, counter, text in KERNEL_SERIES:
        kind = CounterMetricFamily if counter else GaugeMetricFamily
        family = kind(f"{PREFIX}_{name.removesuffix('_total') if counter else name}", text,
                      labels=KERNEL_LABELS)
        for *labels, stat in rows:
            value = device_utilization(stat) if key is None else stat.get(key)
            if value is not None:
                family.add_metric([str(label or "") for label in labels], float(value))
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
    if not actor_for(user, keypair).is_admin:
        return 403, "Only administrators and the metrics token may read the metrics."
    return None


def metrics_view(request):
    refusal = _refusal(request)
    if refusal is not None:
        status, message = refusal
        response = JsonResponse(error_body(status, message), status=status)
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    # 0.0.4: the text format every Prometheus reads (Debian 12 ships 2.42).
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_PLAIN_0_0_4)
