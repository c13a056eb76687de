"""A plugin loaded before the settings (pyproject's addopts `-p tests.xdist_isolation`): under
pytest-xdist (`make test-fast`), each worker gw<n> gets Redis database base+1+n, so workers
share no channel groups, metrics, rate-limit windows or broker queues. pytest-django gives
each worker a test database of its own."""

import os
from urllib.parse import urlsplit, urlunsplit


def own_redis_database(url, worker):
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{base + 1 + int(worker.removeprefix('gw'))}"))


if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = own_redis_database(os.environ["REDIS_URL"],
                                                 os.environ["PYTEST_XDIST_WORKER"])
