"""REDIS_URL: one Redis server, or the Sentinels that name the master of one.

    redis://[:PASSWORD@]HOST:PORT/DB
    sentinel://[:PASSWORD@]SENTINEL1:PORT[/DB];sentinel://SENTINEL2:PORT[;...]

The second is kombu's own form (Celery's broker and result backend take it as it is, with
`master_name` in their transport options); from it, settings.py gives channels-redis its
`sentinels` host and this module gives the project's own uses (metrics, rate limit, the
beat lock, the broker ping) a redis-py client of the current master. The password and
database number of the first sentinel URL are the master's (as kombu reads them);
REDIS_SENTINEL_PASSWORD is the sentinels' own, if they have one.
"""

import dataclasses
from urllib.parse import unquote, urlparse

import redis
from redis.sentinel import Sentinel


@dataclasses.dataclass(frozen=True)
class RedisTarget:
    url: str
    db: int = 0
    password: str | None = None
    username: str | None = None
    sentinels: tuple = ()  # ((host, port), ...); empty for a plain redis:// URL
    master: str = ""
    sentinel_password: str | None = None


def parse(url, master="mymaster", sentinel_password=None):
    """A RedisTarget from REDIS_URL; ValueError names what is wrong."""
    parts = [urlparse(part.strip()) for part in url.split(";") if part.strip()]
    if not parts:
        raise ValueError("REDIS_URL is empty")
    schemes = {part.scheme for part in parts}
    if schemes == {"sentinel"}:
        first = parts[0]
        sentinels = tuple((part.hostname or "127.0.0.1", part.port or 26379)
                          for part in parts)
        if not master:
            raise ValueError("REDIS_SENTINEL_MASTER must name the master")
        return RedisTarget(url=url, db=_db(first.path), password=_unquoted(first.password),
                           username=_unquoted(first.username), sentinels=sentinels,
                           master=master, sentinel_password=sentinel_password or None)
    if len(parts) > 1 or not schemes <= {"redis", "rediss", "unix"}:
        raise ValueError(f"REDIS_URL must be redis://… or sentinel://…;sentinel://…, not {url!r}")
    return RedisTarget(url=url, db=_db(parts[0].path), password=_unquoted(parts[0].password))


def _db(path):
    path = path.strip("/")
    if not path:
        return 0
    if not path.isdigit():
        raise ValueError(f"a Redis database number, not {path!r}")
    return int(path)


def _unquoted(value):
    return unquote(value) if value else None


def transport_options(target):
    """Celery's broker and result backend options for the target (none for redis://)."""
    if not target.sentinels:
        return {}
    options = {"master_name": target.master}
    if target.sentinel_password:
        options["sentinel_kwargs"] = {"password": target.sentinel_password}
    return options


def channel_layer_host(target):
    """channels-redis' `hosts` entry for the target."""
    if not target.sentinels:
        return target.url
    host = {"sentinels": list(target.sentinels), "master_name": target.master,
            "db": target.db}
    if target.password:
        host["password"] = target.password
    if target.username:
        host["username"] = target.username
    if target.sentinel_password:
        host["sentinel_kwargs"] = {"password": target.sentinel_password}
    return host


def client_for(target, **kwargs):
    """A redis-py client of the target; through Sentinel it follows the current master
    (after a failover, the next command asks the sentinels again)."""
    if not target.sentinels:
        return redis.Redis.from_url(target.url, **kwargs)
    sentinel_kwargs = {key: kwargs[key] for key in ("socket_timeout", "socket_connect_timeout")
                       if key in kwargs}
    if target.sentinel_password:
        sentinel_kwargs["password"] = target.sentinel_password
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(target.master, db=target.db, password=target.password,
                               username=target.username, **kwargs)


def client(url=None, **kwargs):
    """A client of settings.REDIS_URL's Redis (or of `url`, in the same forms)."""
    from django.conf import settings

    target = parse(url or settings.REDIS_URL, settings.REDIS_SENTINEL_MASTER,
                   settings.REDIS_SENTINEL_PASSWORD)
    return client_for(target, **kwargs)
