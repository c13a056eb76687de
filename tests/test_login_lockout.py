"""Failed logins are limited per user name and per address (django-axes): the dashboard's
and the admin's login forms answer 429 with what happened and how long to wait."""

from datetime import timedelta

import pytest
import time_machine
from django.conf import settings

from common import clock
from identity_app.models import AuditEntry

LOGIN = "/accounts/login/"


def try_login(client, username, password, address="198.51.100.4", path=LOGIN):
    # As a browser asks: an HTML page (API clients get the JSON error body).
    return client.post(path, {"username": username, "password": password},
                       REMOTE_ADDR=address, HTTP_ACCEPT="text/html")


def test_a_user_name_is_locked_after_the_limit_with_the_time_to_wait(client, alice):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert try_login(client, "alice", "wrong").status_code == 200  # the form again
    assert try_login(client, "alice", "wrong").status_code == 429  # the last one allowed
    locked = try_login(client, "alice", "correct horse", address="203.0.113.5")
    assert locked.status_code == 429
    text = locked.content.decode()
    assert "Too many failed logins" in text and "Try again in 15 minutes" in text
    assert locked["Retry-After"] == "900"
    # The admin's login form is refused the same way.
    assert try_login(client, "alice", "correct horse", path="/admin/login/").status_code == 429
    assert AuditEntry.objects.filter(action="login.locked_out", username="alice").exists()
    assert not AuditEntry.objects.filter(action="login", result="ok").exists()
    # After the cool-off, the right password lets her in again.
    with time_machine.travel(clock.now() + timedelta(minutes=16), tick=False):
        assert try_login(client, "alice", "correct horse").status_code == 302


def test_an_address_is_locked_after_the_limit_whatever_the_user_names(client, alice, bob):
    for i in range(settings.AXES_FAILURE_LIMIT):
        try_login(client, f"guess{i}", "wrong", address="192.0.2.66")
    assert try_login(client, "alice", "correct horse", address="192.0.2.66").status_code \
        == 429
    # alice herself failed nothing: from another address she logs in.
    assert try_login(client, "alice", "correct horse", address="192.0.2.67").status_code \
        == 302


@pytest.mark.parametrize("failures", [settings.AXES_FAILURE_LIMIT - 1])
def test_a_success_before_the_limit_resets_the_count(client, alice, failures):
    for _ in range(failures):
        try_login(client, "alice", "wrong")
    assert try_login(client, "alice", "correct horse").status_code == 302
    client.logout()
    for _ in range(failures):
        try_login(client, "alice", "wrong", address="198.51.100.9")
    assert try_login(client, "alice", "correct horse", address="198.51.100.9").status_code \
        == 302
