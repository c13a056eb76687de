"""A real Prometheus (Debian's `prometheus`) scrapes a live web process's /metrics."""

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.test import override_settings

from backendai_web import serve
from common import clock
from scheduling_app.models import ScalingGroup
from sessions_app import series
from sessions_app.enums import Status
from tests.factories import make_agent, make_session
from tests.support import (
    PROCESS_SETTINGS,
    Process,
    database_url_of_test_db,
    free_port,
    need,
    wait_for,
)

TOKEN = "s3cret-metrics-token"


# A real Prometheus (Debian's `prometheus`) scraping a live web process.

@pytest.fixture
def web_with_token(transactional_db, redis_available, tmp_path):
    port = free_port()
    env = {**os.environ, **PROCESS_SETTINGS,
           "REDIS_URL": settings.REDIS_URL, "DATABASE_URL": database_url_of_test_db(),
           "METRICS_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    web = Process("web", serve.command(port), env, tmp_path).start()
    web.url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(web.url + "/") is not None, timeout=60, message="the web process")
        yield web
    finally:
        web.stop()


def _get(url, **kw):
    try:
        return requests.get(url, timeout=5, **kw)
    except requests.RequestException:
        return None


def test_a_real_prometheus_scrapes_the_metrics_and_answers_a_query(web_with_token, alice,
                                                                   tmp_path):
    binary = "/usr/bin/prometheus"
    need("Prometheus", None if Path(binary).exists()
         else "no /usr/bin/prometheus (apt-get install prometheus)")
    # A group without agents: a live system's scheduler in the same test run places none.
    ScalingGroup.objects.create(name="prom-no-agents")
    for i in range(3):
        make_session(alice, name=f"queued-{i}", scaling_group="prom-no-agents")
    # A RUNNING kernel with a sample, on an agent the scheduler leaves alone.
    agent = make_agent("prom-agent", group="prom-kernels", schedulable=False)
    measured = make_session(alice, Status.RUNNING, agent=agent, name="measured",
                            scaling_group="prom-kernels")
    measured.kernels.update(last_stat={"at": time.time(), "cpu_percent": 33.0,
                                       "mem_bytes": 4096, "net_rx": 10, "net_tx": 20})
    web_port = web_with_token.url.rsplit(":", 1)[1]
    (tmp_path / "prometheus.yml").write_text(f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: backendai
    metrics_path: /metrics
    authorization:
      credentials: {TOKEN}
    static_configs:
      - targets: ["127.0.0.1:{web_port}"]
""")
    port = free_port()
    prometheus = Process("prometheus", [
        binary, f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
    ], os.environ, tmp_path).start()
    api = f"http://127.0.0.1:{port}/api/v1/query"
    try:
        def queried(query):
            response = _get(api, params={"query": query})
            if response is None or not response.ok:
                return None
            result = response.json()["data"]["result"]
            return result or None

        result = wait_for(lambda: queried(
            'backendai_sessions{status="PENDING",scaling_group="prom-no-agents"}'), timeout=60,
            interval=0.5, message=f"Prometheus to have scraped:\n{prometheus.output()[-2000:]}")
        assert float(result[0]["value"][1]) == 3
        assert result[0]["metric"]["job"] == "backendai"
        up = queried('up{job="backendai"}')
        assert float(up[0]["value"][1]) == 1
        # The per-kernel series, read back as the session page's charts read them.
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: queried(f'backendai_kernel_cpu_percent{{session_id="{measured.pk}"}}'),
                 timeout=30, interval=0.5, message="the kernel's series in Prometheus")
        now = clock.now()
        rows = series.prometheus_points(base, measured.pk, now - timedelta(minutes=5), now)
        kernel = measured.kernels.get()
        assert list(rows) == [str(kernel.pk)]
        assert rows[str(kernel.pk)][-1][1:3] == [33.0, 4096.0]  # cpu %, memory
        assert rows[str(kernel.pk)][-1][6] == 20.0  # net_tx
        with override_settings(STATS_PROMETHEUS_URL=base):
            body = series.kernel_series(measured, minutes=5)
        assert body["source"] == "prometheus"
        assert body["kernels"][0]["points"]["cpu"][-1] == 33.0
        # A scrape without the token is refused: Prometheus' target is down then.
        assert _get(web_with_token.url + "/metrics").status_code == 401
    finally:
        prometheus.stop()
