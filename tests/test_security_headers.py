"""Production settings pass `manage.py check --deploy`; every page Django answers carries
a Content-Security-Policy that allows scripts from this origin's files only, and HSTS when
TLS is on (HTTPS=true)."""

import os
import re
import subprocess
import sys
from pathlib import Path

from cryptography.fernet import Fernet
from django.core.management import call_command
from django.test import Client

ROOT = Path(__file__).resolve().parent.parent


def policy(response):
    return dict(part.strip().split(" ", 1)
                for part in response["Content-Security-Policy"].split(";") if part.strip())


def test_check_deploy_with_production_settings_from_the_environment_gives_no_warning():
    env = {**os.environ, "DEBUG": "false", "HTTPS": "true", "ALLOWED_HOSTS": "bai.example.org",
           "SECRET_KEY": "k" * 20 + Fernet.generate_key().decode(),
           "SECRET_KEY_ENCRYPTION_KEYS": Fernet.generate_key().decode()}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy",
                           "--fail-level", "WARNING"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_check_deploy_warns_when_secrets_are_encrypted_with_a_key_from_secret_key(
        settings, capsys):
    settings.SECRET_KEY_ENCRYPTION_KEYS = []
    call_command("check", deploy=True, tags=["security"])  # warnings only: no exit
    assert "identity.W001" in capsys.readouterr().err


def test_a_page_allows_scripts_from_this_origin_only(as_alice):
    answer = as_alice.get("/sessions/")
    assert answer.status_code == 200
    csp = policy(answer)
    assert csp["script-src"] == "'self'"
    assert csp["object-src"] == "'none'" and csp["frame-ancestors"] == "'self'"
    assert csp["connect-src"] == "'self'"  # websockets to this origin: CSP3's 'self'


def test_the_login_page_and_the_admin_carry_the_policy(client, db):
    assert "script-src 'self'" in client.get("/accounts/login/")["Content-Security-Policy"]
    assert "script-src 'self'" in client.get("/admin/login/")["Content-Security-Policy"]


def test_no_template_has_an_inline_script_the_policy_would_block():
    inline = []
    for path in (ROOT / "templates").rglob("*.html"):
        for tag in re.findall(r"<script\b[^>]*>", path.read_text()):
            if "src=" not in tag and 'type="application/json"' not in tag:
                inline.append(f"{path.relative_to(ROOT)}: {tag}")
        if re.search(r"\son[a-z]+=\"", path.read_text()):
            inline.append(f"{path.relative_to(ROOT)}: an on…= handler")
    assert inline == []


def test_the_api_docs_page_runs_its_script_from_a_file(client, db):
    page = client.get("/api/docs/")
    assert page.status_code == 200
    scripts = re.findall(rb"<script\b[^>]*>", page.content)
    assert scripts and all(b"src=" in tag for tag in scripts)


def test_hsts_is_sent_over_tls_when_https_is_on(settings, db):
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    answer = Client().get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")
    assert answer["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert "Strict-Transport-Security" not in Client().get("/accounts/login/")
