"""Several of everything (docs/operations.md): PostgreSQL through libpq's multi-host URL,
Redis through Sentinel, and the lock that lets one beat of several fire."""

import time

import psycopg
import pytest
import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.postgresql.base import DatabaseWrapper

from backendai_web import beat, redis_conn
from backendai_web.settings import database_settings

MULTI = ("postgres://u:p%40ss@db1.example:5432,db2.example:5433/bai"
         "?target_session_attrs=read-write&connect_timeout=3")


def test_a_multi_host_database_url_gives_libpq_its_host_and_port_lists():
    config = database_settings(MULTI)
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["HOST"], config["PORT"]) == ("db1.example,db2.example", "5432,5433")
    assert (config["USER"], config["PASSWORD"], config["NAME"]) == ("u", "p@ss", "bai")
    assert config["OPTIONS"]["target_session_attrs"] == "read-write"
    assert config["OPTIONS"]["connect_timeout"] == 3
    assert "pool" in config["OPTIONS"]  # the pool, as with one host


def test_hosts_without_ports_take_postgresqls_port_and_one_host_is_unchanged():
    config = database_settings("postgres://u:p@db1,db2:6000/bai")
    assert (config["HOST"], config["PORT"]) == ("db1,db2", "5432,6000")
    one = database_settings("postgres://u:p@db1:6000/bai")
    assert (one["HOST"], one["PORT"]) == ("db1", 6000)


def test_a_malformed_host_in_a_multi_host_url_is_a_clear_error():
    with pytest.raises(ImproperlyConfigured, match="'db2:x' is not HOST or HOST:PORT"):
        database_settings("postgres://u:p@db1:5432,db2:x/bai")


def test_libpq_skips_a_dead_first_host_and_connects_to_the_next(postgres):
    """The Django connection parameters of a multi-host URL, as psycopg receives them: the
    first host refuses (nothing listens on port 9), the second is this test's PostgreSQL."""
    db = settings.DATABASES["default"]
    url = (f"postgres://{db['USER']}:{db['PASSWORD']}@127.0.0.1:9,{db['HOST'] or '127.0.0.1'}:"
           f"{db['PORT'] or 5432}/{db['NAME']}?target_session_attrs=read-write")
    config = database_settings(url)
    config["OPTIONS"].pop("pool")
    config.update(TIME_ZONE=None, AUTOCOMMIT=True, ATOMIC_REQUESTS=False)
    params = DatabaseWrapper(config).get_connection_params()
    with psycopg.connect(**params) as conn:
        assert conn.execute("select pg_is_in_recovery()").fetchone() == (False,)
        assert conn.info.port == int(db["PORT"] or 5432)


SENTINELS = "sentinel://:secret@s1:26379/3;sentinel://s2:26380;sentinel://s3"


def test_a_sentinel_url_names_the_sentinels_master_database_and_password():
    target = redis_conn.parse(SENTINELS, "bai-master", "sentinel-pw")
    assert target.sentinels == (("s1", 26379), ("s2", 26380), ("s3", 26379))
    assert (target.master, target.db, target.password) == ("bai-master", 3, "secret")
    assert redis_conn.transport_options(target) == {
        "master_name": "bai-master", "sentinel_kwargs": {"password": "sentinel-pw"}}
    assert redis_conn.channel_layer_host(target) == {
        "sentinels": [("s1", 26379), ("s2", 26380), ("s3", 26379)],
        "master_name": "bai-master", "db": 3, "password": "secret",
        "sentinel_kwargs": {"password": "sentinel-pw"}}


def test_a_plain_redis_url_needs_no_transport_options():
    target = redis_conn.parse("redis://:pw@cache:6380/7")
    assert (target.sentinels, target.db, target.password) == ((), 7, "pw")
    assert redis_conn.transport_options(target) == {}
    assert redis_conn.channel_layer_host(target) == "redis://:pw@cache:6380/7"


@pytest.mark.parametrize("url", ["http://cache:6379/0", "redis://a/0;redis://b/0",
                                 "redis://cache/zero"])
def test_a_redis_url_of_another_form_is_a_clear_error(url):
    with pytest.raises(ValueError):
        redis_conn.parse(url)


def test_celery_and_channels_settings_follow_a_sentinel_redis_url(monkeypatch):
    """settings.py read again with a sentinel:// REDIS_URL (a fresh import of the module)."""
    import importlib.util

    monkeypatch.setenv("REDIS_URL", SENTINELS)
    monkeypatch.setenv("REDIS_SENTINEL_MASTER", "bai-master")
    spec = importlib.util.find_spec("backendai_web.settings")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh.CELERY_BROKER_URL == SENTINELS
    assert fresh.CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] == "bai-master"
    assert fresh.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] == 600
    assert fresh.CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS == {"master_name": "bai-master"}
    layer = fresh.CHANNEL_LAYERS["default"]["CONFIG"]
    assert layer["hosts"][0]["master_name"] == "bai-master"
    assert layer["prefix"] == "bai-ws/3/"


# The beat lock, on this test's Redis database.

class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def lock_redis(redis_available):
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(beat.LOCK_KEY)
    yield client
    client.delete(beat.LOCK_KEY)


def test_one_beat_holds_the_lock_and_a_standby_takes_it_only_once_it_expired(lock_redis):
    active = beat.ActiveBeatLock(lock_redis, ttl=1, name="active")
    standby = beat.ActiveBeatLock(lock_redis, ttl=1, name="standby")
    assert active.hold() and active.valid()
    assert lock_redis.get(beat.LOCK_KEY).decode().startswith("active:")
    for _ in range(3):  # renewed every third of the TTL, the key never expires
        time.sleep(0.4)
        assert not standby.hold()
        assert active.hold()
    time.sleep(1.1)  # the active beat stopped renewing (killed)
    assert standby.hold()
    assert lock_redis.get(beat.LOCK_KEY).decode().startswith("standby:")
    # The old active beat, back from a stall, finds the lock taken: it stands by.
    assert not active.hold() and not active.valid()
    standby.release()
    assert active.hold()


def test_the_active_beat_sends_only_within_the_ttl_of_its_last_renewal(lock_redis):
    clock = Clock()
    active = beat.ActiveBeatLock(lock_redis, ttl=10, name="active", clock=clock)
    assert active.hold()
    clock.now = 7.9
    assert active.valid()
    clock.now = 8.0  # a margin before Redis lets the key expire
    assert not active.valid()


def test_a_beat_without_redis_is_not_active():
    dead = redis.Redis(host="127.0.0.1", port=9, socket_connect_timeout=0.5)
    lock = beat.ActiveBeatLock(dead, ttl=1, name="cut-off")
    assert not lock.hold() and not lock.valid()
