"""Schemathesis over /api/schema/, against the web process on the test database: for generated and
boundary requests to every operation, no 5xx and every response as the schema says
(status code, content type, body)."""

import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

from identity_app.keypairs import main_keypair
from tests.factories import make_agent, make_session

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance")
CSRF_TOKEN = "s" * 32  # a CSRF secret; the same value as cookie and header passes the check


def run_schemathesis(url, user, tmp_path, phases, max_examples):
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}; csrftoken={CSRF_TOKEN}"
    schemathesis = str(Path(sys.executable).with_name("schemathesis"))
    done = subprocess.run(
        [schemathesis, "run", f"{url}/api/schema/", "--checks", CHECKS,
         "--phases", phases, "--max-examples", str(max_examples),
         "--workers", "1", "--request-timeout", "30", "--seed", "1",
         "-H", f"Cookie: {cookie}", "-H", f"X-CSRFToken: {CSRF_TOKEN}",
         "--report", "junit", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"})
    (tmp_path / "schemathesis.txt").write_text(done.stdout + done.stderr)
    return done.returncode, done.stdout + done.stderr


# The folder routes (issue 17) add a dozen operations: on the shared 2-core machine the
# superadmin's run takes more than pytest's default 300 s; schemathesis itself has 900.
@pytest.mark.timeout(900)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("who, phases", [
    # The superadmin reaches every operation: boundary values (coverage) and generated ones.
    ("superadmin", "examples,coverage,fuzzing"),
    # A user is refused most writes; generated requests are enough to check the refusals.
    ("user", "examples,fuzzing"),
])
def test_every_operation_answers_as_the_schema_says(web_server, alice, carol, who, phases,
                                                    tmp_path):
    make_agent()
    make_session(alice, name="s1")  # something to find, list and refuse to change
    main_keypair(carol)
    code, output = run_schemathesis(web_server.url, carol if who == "superadmin" else alice,
                                    tmp_path, phases, max_examples=10)
    assert code == 0, output[-6000:]
