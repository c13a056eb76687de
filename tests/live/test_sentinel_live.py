"""REDIS_URL through Sentinel, on real servers of this test's own (Debian's redis-server as a
master, a replica and a sentinel, on free ports; the shared Redis is not touched): the
settings that a sentinel:// REDIS_URL gives carry Celery messages, channel-layer group
messages and the project's own commands to the master, and follow it when the sentinel
fails it over."""

import asyncio
import importlib.util
import shutil
import subprocess
from queue import Empty

import pytest
import redis
from celery import Celery
from channels_redis.pubsub import RedisPubSubChannelLayer

from backendai_web import redis_conn
from tests.support import free_port, need, wait_for

MASTER = "bai-test-master"


def start_redis(tmp_path, name, *args):
    port = free_port()
    directory = tmp_path / name
    directory.mkdir()
    process = subprocess.Popen(
        [shutil.which("redis-server"), *args, "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return port, process


def answers(port):
    try:
        return redis.Redis(port=port, socket_timeout=1).ping()
    except redis.RedisError:
        return False


@pytest.fixture
def sentinel(tmp_path):
    need("redis-server", None if shutil.which("redis-server") else "not installed")
    processes = []
    try:
        master_port, process = start_redis(tmp_path, "master")
        processes.append(process)
        replica_port, process = start_redis(tmp_path, "replica", "--replicaof", "127.0.0.1",
                                            str(master_port))
        processes.append(process)
        sentinel_port = free_port()
        config = tmp_path / "sentinel.conf"
        config.write_text(f"port {sentinel_port}\nbind 127.0.0.1\n"
                          f"sentinel monitor {MASTER} 127.0.0.1 {master_port} 1\n"
                          f"sentinel down-after-milliseconds {MASTER} 1000\n"
                          f"sentinel failover-timeout {MASTER} 5000\n")
        processes.append(subprocess.Popen(
            [shutil.which("redis-server"), str(config), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        for port in (master_port, replica_port, sentinel_port):
            wait_for(lambda p=port: answers(p), timeout=10, message=f"redis on {port}")
        replica = redis.Redis(port=replica_port)
        wait_for(lambda: replica.info("replication")["master_link_status"] == "up",
                 timeout=15, message="the replica in sync")
        sentinels = redis.Redis(port=sentinel_port, decode_responses=True)
        wait_for(lambda: sentinels.sentinel_slaves(MASTER), timeout=15,
                 message="the sentinel to know the replica")
        yield {"url": f"sentinel://127.0.0.1:{sentinel_port}/2", "master": master_port,
               "replica": replica_port, "sentinels": sentinels}
    finally:
        for process in processes:
            process.kill()
            process.wait(10)


def settings_with(monkeypatch, url):
    """settings.py read afresh with this REDIS_URL, as a process started with it reads it."""
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("REDIS_SENTINEL_MASTER", MASTER)
    spec = importlib.util.find_spec("backendai_web.settings")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_sentinel_redis_url_carries_celery_channels_and_own_commands_across_a_failover(
        sentinel, monkeypatch):
    fresh = settings_with(monkeypatch, sentinel["url"])
    app = Celery("sentinel-test", broker=fresh.CELERY_BROKER_URL)
    app.conf.broker_transport_options = fresh.CELERY_BROKER_TRANSPORT_OPTIONS
    layer = RedisPubSubChannelLayer(**fresh.CHANNEL_LAYERS["default"]["CONFIG"])
    client = redis_conn.client_for(fresh.REDIS_TARGET, socket_timeout=2)

    async def group_message(text):
        channel = await layer.new_channel()
        await layer.group_add("sessions", channel)
        await layer.group_send("sessions", {"type": "event", "text": text})
        received = await asyncio.wait_for(layer.receive(channel), 5)
        await layer.group_discard("sessions", channel)
        return received["text"]

    def round_trip(tag):
        client.set("probe", tag)
        with app.connection_for_write() as connection:
            queue = connection.SimpleQueue(f"probe-{tag}")
            queue.put({"tag": tag})
            message = queue.get(timeout=5)
            message.ack()
            queue.close()
        return client.get("probe").decode(), message.payload["tag"]

    assert round_trip("before") == ("before", "before")
    assert asyncio.run(group_message("before")) == "before"
    # The key is in the master's database 2 (the URL's), as a plain client of it sees.
    assert redis.Redis(port=sentinel["master"], db=2).get("probe") == b"before"

    sentinel["sentinels"].execute_command("SENTINEL", "FAILOVER", MASTER)
    wait_for(lambda: int(sentinel["sentinels"].sentinel_get_master_addr_by_name(MASTER)[1])
             == sentinel["replica"], timeout=20, message="the failover")
    wait_for(lambda: redis.Redis(port=sentinel["replica"]).info("replication")["role"]
             == "master", timeout=20, message="the replica promoted")
    # Until the old master is told it is a replica, it still takes writes, which it then
    # drops when it syncs from the new one (Sentinel's documented window).
    wait_for(lambda: redis.Redis(port=sentinel["master"]).info("replication")["role"]
             == "slave", timeout=20, message="the old master demoted")

    def after_failover():
        try:
            return round_trip("after") == ("after", "after")
        except (redis.RedisError, OSError, Empty):
            return False  # connections to the old master fail once, then find the new one

    wait_for(after_failover, timeout=20, interval=0.5, message="writes to the new master")
    assert redis.Redis(port=sentinel["replica"], db=2).get("probe") == b"after"
    layer = RedisPubSubChannelLayer(**fresh.CHANNEL_LAYERS["default"]["CONFIG"])
    assert asyncio.run(group_message("after")) == "after"
