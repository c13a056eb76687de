"""status_data by name: each write sets only its keys, in the UPDATE itself, so that a writer
holding an old copy cannot undo another writer's key (such as the retry counter)."""


import pytest
from django.db import connection

from common import clock
from sessions_app import engine
from sessions_app.enums import Status
from sessions_app.lifecycle.progress import retry_stage
from sessions_app.models import Kernel
from sessions_app.status_data import Key, StatusData
from tests.factories import make_agent, make_session
from tests.test_races import no_broker, race  # noqa: F401 (no_broker is a fixture)

S = Status
ROUNDS = 40


def test_a_write_from_an_old_copy_keeps_the_retry_counter(alice, sent):
    kernel = make_session(alice, S.CREATING, agent=make_agent()).kernels.get()
    old_copy = Kernel.objects.get(pk=kernel.pk)
    assert retry_stage(kernel, "creating", "container creation timed out") == "retried"
    engine.merge_status_data(old_copy, {Key.LAST_DESTROY_REQUEST: clock.now().isoformat()})
    data = StatusData(Kernel.objects.get(pk=kernel.pk).status_data)
    assert data.retries == {"creating": 1}
    assert data.time_of(Key.LAST_DESTROY_REQUEST) is not None


def test_a_transition_sets_its_keys_and_keeps_the_others(alice, sent):
    kernel = make_session(alice, S.CREATING, agent=make_agent()).kernels.get()
    engine.merge_status_data(kernel, {Key.RETRIES: {"creating": 2}})
    stale = Kernel.objects.get(pk=kernel.pk)
    stale.status_data = {}
    engine.mark_kernel_error(stale, reason="boom", status_data={Key.TEARDOWN_ERROR: "boom"})
    data = Kernel.objects.get(pk=kernel.pk).status_data
    assert data == {"retries": {"creating": 2}, "teardown_error": "boom"}


def test_only_registered_keys_are_written(alice):
    kernel = make_session(alice).kernels.get()
    with pytest.raises(ValueError):
        engine.merge_status_data(kernel, {"made_up": 1})
    with pytest.raises(AssertionError):
        engine.set_kernel_data(kernel, status_data={})


def test_json_nulls_and_nested_objects_survive_a_merge(alice):
    kernel = make_session(alice).kernels.get()
    engine.merge_status_data(kernel, {Key.KERNEL: {"exit_code": None}, Key.FORCED: False})
    engine.merge_status_data(kernel, {Key.SESSION: {"status": "terminating"}})
    assert Kernel.objects.get(pk=kernel.pk).status_data == {
        "kernel": {"exit_code": None}, "forced": False, "session": {"status": "terminating"}}


@pytest.mark.django_db(transaction=True)
def test_two_writers_at_once_lose_nothing(postgres, alice, no_broker, settings):  # noqa: F811
    """Real concurrency on PostgreSQL: retries counted under the kernel's lock race a
    writer of another key that holds a copy read before any of them."""
    kernel = make_session(alice, S.CREATING, agent=make_agent()).kernels.get()
    old_copy = Kernel.objects.get(pk=kernel.pk)
    settings.RETRY_LIMIT = 10**6  # every try is a retry here

    def retries():
        for _ in range(ROUNDS):
            retry_stage(Kernel.objects.get(pk=kernel.pk), "creating", "timed out")

    def markers():
        for n in range(ROUNDS):
            engine.merge_status_data(old_copy, {Key.LAST_CHECK: f"2026-01-01T00:00:{n:02d}"})

    outcomes = race(retries, markers, names=["retries", "markers"])
    assert outcomes == [None, None]
    data = Kernel.objects.get(pk=kernel.pk).status_data
    assert data["retries"] == {"creating": ROUNDS}
    assert data["last_check"] == f"2026-01-01T00:00:{ROUNDS - 1:02d}"
    connection.close()
