"""The usage page: a user's or a project's usage over a period, per day (per month for
periods over three months), stacked by slot kind in a uPlot chart, with the same numbers in
a table that works without it."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone

from accounting_app import sums
from accounting_app.models import UsageRecord
from common import clock
from identity_app.acting import actor_of
from identity_app.models import Project

GIB = 1 << 30
# How each kind's sum reads on the page: (label, divisor of its slot-seconds).
UNITS = {"cpu": ("CPU core-hours", 3600), "mem": ("memory GiB-hours", 3600 * GIB),
         "storage": ("kept files GiB-hours", 3600 * GIB)}
DAILY_UP_TO = timedelta(days=92)


def unit_of(kind):
    return UNITS.get(kind, (f"{kind} hours", 3600))


def buckets(period, by_month):
    """The keys of every day (or month) of the period, so that the chart has no gaps."""
    keys, day = [], timezone.localtime(period.start).date()
    last = timezone.localtime(period.end - timedelta(microseconds=1)).date()
    while day <= last:
        key = day.strftime("%Y-%m") if by_month else day.isoformat()
        if key not in keys:
            keys.append(key)
        day += timedelta(days=1)
    return keys


def table(rows, period, by_month):
    """(columns, [(key, [values])], totals) in the page's units; empty rows when nothing
    was used."""
    kinds = [*sums.slot_kinds(rows), "storage"]
    by_key = {row["key"]: row for row in rows}
    lines = []
    for key in buckets(period, by_month):
        row = by_key.get(key)
        values = [0.0] * len(kinds)
        if row is not None:
            values = [(row["storage_byte_seconds"] if kind == "storage"
                       else row["slot_seconds"].get(kind, 0)) / unit_of(kind)[1]
                      for kind in kinds]
        lines.append((key, values))
    totals = [sum(line[1][i] for line in lines) for i in range(len(kinds))]
    used = [i for i, total in enumerate(totals) if total]
    return ([(kinds[i], unit_of(kinds[i])[0]) for i in used],
            [(key, [values[i] for i in used]) for key, values in lines],
            [totals[i] for i in used])


@login_required
def usage_page(request):
    actor = actor_of(request)
    params = request.GET.dict()
    if not params.get("project") and not params.get("user"):
        params["user"] = actor.user.get_username()
    context = {"admin": actor.is_admin, "rendered_at": clock.now(), "params": params,
               "columns": [], "lines": [], "totals": [], "error": ""}
    status = 200
    try:
        period = sums.period_from(params)
        records = sums.filter_by(UsageRecord.objects.restrict(actor), params, actor)
        by_month = period.end - period.start > DAILY_UP_TO
        days = sums.filter_by(sums.days_of(actor), params, actor)
        rows = sums.sums(records, period, "month" if by_month else "day", days=days)
    except sums.UsageQueryError as bad:
        context["error"], status = bad.message, bad.status
    else:
        columns, lines, totals = table(rows, period, by_month)
        context.update(period=period, columns=columns, lines=lines, totals=totals,
                       by_month=by_month,
                       chart={"labels": [label for _, label in columns],
                              "kinds": [kind for kind, _ in columns],
                              "keys": [key for key, _ in lines],
                              "values": [[values[i] for _, values in lines]
                                         for i in range(len(columns))]})
    if actor.is_admin:
        context["users"] = get_user_model().objects.order_by("username").values_list(
            "username", flat=True)[:500]
        context["projects"] = Project.objects.order_by("name").values_list("name",
                                                                            flat=True)[:500]
    return render(request, "usage/usage.html", context, status=status)
