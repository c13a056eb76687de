#!/usr/bin/env bash
# A PostgreSQL cluster and a Redis server of their own for the tests that stop and start
# the services they run on (tests/live/test_faults_live.py), so that those tests run beside
# the other live tests instead of alone: `make test` uses it where it can.
#
#   scripts/private_services.sh start   # prints DATABASE_URL=… REDIS_URL=… for them
#   scripts/private_services.sh stop    # stops both and drops the cluster
#
# `start` needs root, Debian's pg_createcluster and redis-server, and a DATABASE_URL naming a
# local PostgreSQL (whose version it uses); otherwise it prints why on stderr and exits 1,
# and the caller runs those tests alone, on the shared services, as before.
set -euo pipefail

NAME=bai-private
PG_PORT=${PRIVATE_PG_PORT:-5439}
REDIS_PORT=${PRIVATE_REDIS_PORT:-6399}
DIR=${PRIVATE_SERVICES_DIR:-/var/tmp/bai-private-services}

made=0  # set once `start` has begun making them: a failure after that removes what it made
cannot() { echo "private_services: $*" >&2; [ "$made" = 0 ] || stop; exit 1; }

version() { pg_lsclusters --no-header 2>/dev/null | awk '{print $1}' | sort -V | tail -n 1; }

stop() {
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    local v
    v=$(version)
    if [ -n "$v" ] && pg_lsclusters --no-header | awk '{print $2}' | grep -qx "$NAME"; then
        pg_dropcluster --stop "$v" "$NAME" >/dev/null 2>&1 || true
    fi
    rm -rf "$DIR"
}

start() {
    [ "$(id -u)" = 0 ] || cannot "not root"
    command -v pg_createcluster >/dev/null || cannot "no pg_createcluster"
    command -v redis-server >/dev/null || cannot "no redis-server"
    case "${DATABASE_URL:-}" in
        postgres://*@127.0.0.1:*|postgres://*@localhost:*|postgresql://*@127.0.0.1:*) ;;
        *) cannot "DATABASE_URL does not name a local PostgreSQL" ;;
    esac
    local v
    v=$(version)
    [ -n "$v" ] || cannot "no PostgreSQL cluster to take the version of"
    stop  # what an interrupted run left
    made=1
    pg_createcluster "$v" "$NAME" -p "$PG_PORT" --start >/dev/null 2>&1 \
        || cannot "pg_createcluster $v $NAME failed"
    for _ in $(seq 30); do su postgres -c "pg_isready -q -p $PG_PORT" && break; sleep 0.5; done
    su postgres -c "psql -q -p $PG_PORT -c \"alter user postgres password 'postgres'\"" \
        >/dev/null || cannot "the new cluster does not answer"
    mkdir -p "$DIR"
    redis-server --daemonize yes --port "$REDIS_PORT" --bind 127.0.0.1 --save "" \
        --appendonly no --dir "$DIR" --pidfile "$DIR/redis.pid" >/dev/null \
        || cannot "redis-server did not start"
    for _ in $(seq 30); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 || cannot "redis-server does not answer"
    echo "DATABASE_URL=postgres://postgres:postgres@127.0.0.1:$PG_PORT/backendai_test" \
         "REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
