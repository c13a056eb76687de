"""Usage sums over a year of accounting records (issue 35): 1,000 users, 10,000 sessions a
day for 365 days, on PostgreSQL; each sum query timed (median of 3; goal ≤ 1 s).

The records go into a database of their own, DATABASE_URL's name + `_bench_usage`, made
and migrated here and kept for the next run (BENCH_USAGE_FRESH=1 makes it again).
BENCH_USAGE_SCALE=0.1 generates a tenth of the sessions (the users stay 1,000).

Only this bench's functions live here (generate_year, time_sums); other usage figures
(stats ingest, chart lag) belong in their own functions or files.
"""

import io
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USERS = 1000
PROJECTS = 50
GROUPS = 4
SESSIONS_PER_DAY = 10_000
DAYS = 365
YEAR_START = datetime(2025, 1, 1, tzinfo=UTC)
GPU_SHARE = 0.1
MIB = 1 << 20


def bench_database():
    """Point Django at the bench's own database (made if missing); its URL."""
    import dj_database_url
    import psycopg

    url = os.environ.get("DATABASE_URL", "")
    config = dj_database_url.parse(url) if url else {}
    if config.get("ENGINE") != "django.db.backends.postgresql":
        sys.exit("bench_usage needs DATABASE_URL of a PostgreSQL server (the goal is "
                 "PostgreSQL's)")
    name = f"{config['NAME']}_bench_usage"
    admin = psycopg.connect(host=config["HOST"], port=config["PORT"] or 5432,
                            user=config["USER"], password=config["PASSWORD"],
                            dbname="postgres", autocommit=True)
    fresh = os.environ.get("BENCH_USAGE_FRESH") == "1"
    exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    if exists and fresh:
        admin.execute(f'DROP DATABASE "{name}"')
    if not exists or fresh:
        admin.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    os.environ["DATABASE_URL"] = url.rsplit("/", 1)[0] + "/" + name
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return name


def pieces(start, end):
    """records.split_by_day for UTC days, without its time zone arithmetic (the bench's
    TIME_ZONE is UTC): [(day, start, end)]."""
    found = []
    while True:
        day = int(start // 86400)
        edge = (day + 1) * 86400
        found.append((DAY_NAMES.get(day) or _day_name(day), start, min(end, edge)))
        if end <= edge:
            return found
        start = edge


DAY_NAMES = {}


def _day_name(day):
    DAY_NAMES[day] = datetime.fromtimestamp(day * 86400, tz=UTC).date().isoformat()
    return DAY_NAMES[day]


def generate_year(scale, seed=35):
    """A year of records by COPY, unless the database has them already (the same scale)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection

    from accounting_app.models import DeviceSlotKind, UsageRecord
    from identity_app.models import Domain, Project
    from scheduling_app.models import ScalingGroup

    if settings.TIME_ZONE != "UTC":
        sys.exit("bench_usage cuts days in UTC: run it with TIME_ZONE=UTC")
    sessions_per_day = int(SESSIONS_PER_DAY * scale)
    expected = sessions_per_day * DAYS
    marker = f"bench-{expected}"
    if UsageRecord.objects.filter(session_name=marker).exists():
        print(f"the database has the year already ({expected:,} sessions)", flush=True)
        return
    UsageRecord.objects.all().delete()
    DeviceSlotKind.objects.get_or_create(name="cuda.device")
    rng = random.Random(seed)
    domain, _ = Domain.objects.get_or_create(name="default")
    User = get_user_model()
    existing = set(User.objects.filter(username__startswith="u").values_list("username",
                                                                             flat=True))
    User.objects.bulk_create([User(username=f"u{i:04d}", password="!")
                              for i in range(USERS) if f"u{i:04d}" not in existing])
    users = list(User.objects.filter(username__startswith="u").order_by("username")
                 .values_list("id", flat=True))[:USERS]
    projects = [Project.objects.get_or_create(domain=domain, name=f"p{i:02d}")[0].pk
                for i in range(PROJECTS)]
    groups = [ScalingGroup.objects.get_or_create(name=f"sg{i}")[0].pk for i in range(GROUPS)]
    project_of = {user: projects[i % PROJECTS] for i, user in enumerate(users)}
    columns = ["kernel_id", "session_id", "session_name", "user_id", "project_id",
               "domain_id", "scaling_group_id", "agent_id", "kind", "day", "start_ts",
               "end_ts", "cpu", "mem", "devices", "stored_bytes", "cpu_used", "mem_peak",
               "mem_byte_seconds", "sampled_seconds", "net_rx", "net_tx", "io_read",
               "io_write", "device_util_seconds", "counters"]
    import uuid

    started = time.monotonic()
    rows = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor
        for day in range(DAYS):
            buffer = io.StringIO()
            day_start = (YEAR_START + timedelta(days=day)).timestamp()
            for n in range(sessions_per_day):
                user = rng.choice(users)
                start = day_start + rng.random() * 86400
                length = min(rng.expovariate(1 / 7200), 48 * 3600)  # mean 2 h, at most 2 d
                gpu = rng.random() < GPU_SHARE
                cpu, mem = rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4, 16)) * 1024 * MIB
                devices = '{"cuda.device": 1}' if gpu else "{}"
                session_id = uuid.UUID(int=rng.getrandbits(128))
                name = marker if day == DAYS - 1 and n == 0 else f"s{n}"
                used = length * cpu * rng.random()
                for piece_day, s, e in pieces(start, start + length):
                    share = (e - s) / length if length else 1
                    buffer.write("\t".join(str(v) for v in (
                        session_id, session_id, name, user, project_of[user], domain.pk,
                        groups[user % GROUPS], "agent", "running", piece_day, s, e,
                        cpu, mem, devices, 0, used * share, mem // 2, mem / 3 * (e - s), e - s,
                        0, 0, 0, 0, 0, "{}")) + "\n")
                    rows += 1
            with raw.copy(f"COPY accounting_app_usagerecord ({', '.join(columns)}) "
                          "FROM STDIN") as copy:
                copy.write(buffer.getvalue())
            if day % 30 == 29 or day == DAYS - 1:
                elapsed = time.monotonic() - started
                print(f"  day {day + 1}/{DAYS}: {rows:,} rows, {elapsed:.0f} s", flush=True)
        cursor.execute("ANALYZE accounting_app_usagerecord")
    print(f"generated {sessions_per_day * DAYS:,} sessions as {rows:,} rows in "
          f"{time.monotonic() - started:.0f} s", flush=True)


def time_sums(repeat=3):
    """{query name: (median seconds, rows answered)} of the sums an operator and a user
    ask for."""
    from django.contrib.auth import get_user_model

    from accounting_app import sums
    from accounting_app.models import UsageDay, UsageRecord
    from identity_app.models import Project

    year = sums.Period(YEAR_START, YEAR_START + timedelta(days=DAYS))
    december = sums.Period(datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
    user = get_user_model().objects.get(username="u0042")
    project = Project.objects.get(name="p07")
    everyone = UsageRecord.objects.all()
    now = YEAR_START + timedelta(days=DAYS + 1)
    days = UsageDay.objects.all()
    # A period cut inside its first and last days: their records are read as well.
    cut = sums.Period(YEAR_START + timedelta(days=100, hours=7),
                      YEAR_START + timedelta(days=280, hours=17))
    queries = {
        "one user, the year, by month": (everyone.filter(user=user), days.filter(user=user),
                                         year, "month"),
        "one project, the year, by month": (everyone.filter(project=project),
                                            days.filter(project=project), year, "month"),
        "everyone, one month, by user": (everyone, days, december, "user"),
        "everyone, one month, by project": (everyone, days, december, "project"),
        "everyone, the year, by month": (everyone, days, year, "month"),
        "everyone, the year, by project": (everyone, days, year, "project"),
        "everyone, 180 days cut mid-day, by user": (everyone, days, cut, "user"),
    }
    figures = {}
    for name, (records, rolled, period, group_by) in queries.items():
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            rows = sums.sums(records, period, group_by, now=now, days=rolled)
            times.append(time.perf_counter() - started)
        figures[name] = (statistics.median(times), len(rows))
    return figures


def roll():
    """The daily rollup of every day over (only the days not yet rolled: none, when the
    kept database was rolled before); (days, seconds)."""
    from django.db import connection

    from accounting_app.rollup import roll_days

    started = time.monotonic()
    days = roll_days()
    if days:  # as autovacuum would soon: the planner's counts of the new rows
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE accounting_app_usageday")
    return days, time.monotonic() - started


def check_rollup():
    """One user's year by month from the rollup and from the records alone: the same."""
    from django.contrib.auth import get_user_model

    from accounting_app import sums
    from accounting_app.models import UsageDay, UsageRecord

    user = get_user_model().objects.get(username="u0042")
    year = sums.Period(YEAR_START, YEAR_START + timedelta(days=DAYS))
    now = YEAR_START + timedelta(days=DAYS + 1)
    plain = sums.sums(UsageRecord.objects.filter(user=user), year, "month", now=now)
    rolled = sums.sums(UsageRecord.objects.filter(user=user), year, "month", now=now,
                       days=UsageDay.objects.filter(user=user))
    worst = max(abs(a["slot_seconds"]["cpu"] - b["slot_seconds"]["cpu"])
                / max(b["slot_seconds"]["cpu"], 1) for a, b in zip(rolled, plain, strict=True))
    same_counts = all((a["key"], a["sessions"], a["kernels"]) == (b["key"], b["sessions"],
                                                                  b["kernels"])
                      for a, b in zip(rolled, plain, strict=True))
    return worst, same_counts


def main():
    sys.path.insert(0, str(ROOT))
    scale = float(os.environ.get("BENCH_USAGE_SCALE", "1"))
    name = bench_database()
    print(f"database {name}; scale {scale} ({int(SESSIONS_PER_DAY * scale):,} sessions a "
          f"day, {USERS:,} users, {DAYS} days)", flush=True)
    generate_year(scale)
    days, seconds = roll()
    print(f"daily rollup: rolled {days} days in {seconds:.1f} s", flush=True)
    worst, same_counts = check_rollup()
    print(f"rollup vs records, one user's year by month: cpu slot-seconds differ by at most "
          f"{worst:.1e} (relative); sessions and kernels "
          f"{'the same' if same_counts else 'DIFFERENT'}", flush=True)
    with open("/proc/loadavg") as load:
        print(f"load average: {load.read().split()[:3]}", flush=True)
    for query, (seconds, rows) in time_sums().items():
        verdict = "ok" if seconds <= 1 else "over"
        print(f"{query:40s} median of 3: {seconds * 1000:8.0f} ms ({rows} groups; goal "
              f"≤ 1 s: {verdict})", flush=True)
