"""Settings switch between the embedded default and real services by environment alone."""

import json
import os
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.db import connection

from tests.support import ROOT

PRINT = ("from django.conf import settings as s; import json; d = s.DATABASES['default']; "
         "print(json.dumps({'engine': d['ENGINE'], 'name': str(d['NAME']), "
         "'options': d.get('OPTIONS', {}), 'broker': s.CELERY_BROKER_URL, "
         "'layer': s.CHANNEL_LAYERS['default']['CONFIG']['hosts'], 'debug': s.DEBUG, "
         "'layer_prefix': s.CHANNEL_LAYERS['default']['CONFIG']['prefix'], "
         "'secret': s.SECRET_KEY}))")


def settings_with(**env):
    clean = {k: v for k, v in os.environ.items()
             if k not in {"DATABASE_URL", "REDIS_URL", "EMBEDDED_REDIS_PORT", "SECRET_KEY"}}
    out = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {PRINT}"], cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "backendai_web.settings", **env},
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)


def test_embedded_default_is_sqlite_in_wal_mode_and_the_embedded_redis():
    s = settings_with()
    assert s["engine"] == "django.db.backends.sqlite3"
    assert s["name"].endswith("var/db.sqlite3")
    assert s["options"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in s["options"]["init_command"]
    assert s["broker"] == "redis://127.0.0.1:6390/0"
    assert s["layer"] == ["redis://127.0.0.1:6390/0"]
    assert s["layer_prefix"] == "bai-ws/0/"


def test_real_services_come_from_database_url_and_redis_url():
    s = settings_with(DATABASE_URL="postgres://u:p@db.example:5432/bai",
                      REDIS_URL="redis://cache.example:6379/3")
    assert s["engine"] == "django.db.backends.postgresql"
    assert s["name"] == "bai"
    assert s["options"]["pool"]["max_size"] == 16  # a connection pool per process
    assert s["broker"] == "redis://cache.example:6379/3"
    assert s["layer"] == ["redis://cache.example:6379/3"]
    assert s["layer_prefix"] == "bai-ws/3/"  # pub/sub ignores database numbers


def test_embedded_redis_port_and_secrets_from_files(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    s = settings_with(EMBEDDED_REDIS_PORT="7001", SECRET_KEY_FILE=str(secret), DEBUG="false")
    assert s["broker"] == "redis://127.0.0.1:7001/0"
    assert s["secret"] == "from-a-file"
    assert s["debug"] is False


@pytest.mark.django_db(transaction=True)
def test_a_closed_connection_goes_back_to_the_pool(postgres):
    """Celery closes the connection after every task: with the pool, the next task gets
    a PostgreSQL backend already open instead of a new one (~15 ms each)."""
    def backend():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]

    backend()
    connection.close()
    pooled = connection.pool.get_stats()["pool_size"]  # the connections it holds
    seen = set()
    for _ in range(10):
        seen.add(backend())
        connection.close()
    assert len(seen) <= pooled < 10, (seen, pooled)  # without the pool: 10 new backends
    assert connection.pool.get_stats()["pool_size"] == pooled  # none opened meanwhile


def test_the_production_settings_of_the_readme_pass_check_deploy_without_a_warning(tmp_path):
    secret = tmp_path / "secret_key"
    secret.write_text("k7Qx2-production-secret-" + "9f8e7d6c5b4a" * 5 + "\n")
    token = tmp_path / "metrics_token"
    token.write_text("scrape-me\n")
    keys = tmp_path / "encryption_keys"
    keys.write_text(Fernet.generate_key().decode() + "\n")
    clean = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}}
    env = {**clean, "DJANGO_SETTINGS_MODULE": "backendai_web.settings", "DEBUG": "false",
           "HTTPS": "true", "SECRET_KEY_FILE": str(secret), "METRICS_TOKEN_FILE": str(token),
           "SECRET_KEY_ENCRYPTION_KEYS_FILE": str(keys),
           "ALLOWED_HOSTS": "bai.example.com", "CSRF_TRUSTED_ORIGINS": "https://bai.example.com",
           "LOG_FORMAT": "json"}
    checked = subprocess.run([sys.executable, "manage.py", "check", "--deploy",
                              "--fail-level", "WARNING"], cwd=ROOT, env=env,
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues (0 silenced)." in checked.stdout
    shown = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import "
         "settings as s; print(s.SECRET_KEY, s.METRICS_TOKEN, s.SESSION_COOKIE_SECURE, "
         "s.SECURE_PROXY_SSL_HEADER)"], cwd=ROOT, env=env, capture_output=True, text=True,
        check=True)
    assert shown.stdout.split()[:4] == [secret.read_text().strip(), "scrape-me", "True",
                                        "('HTTP_X_FORWARDED_PROTO',"]
    # Without the production settings the same check warns (the test can fail).
    plain = subprocess.run([sys.executable, "manage.py", "check", "--deploy",
                            "--fail-level", "WARNING"], cwd=ROOT,
                           env={**clean, "DJANGO_SETTINGS_MODULE": "backendai_web.settings"},
                           capture_output=True, text=True)
    assert plain.returncode != 0 and "security.W018" in plain.stderr + plain.stdout
