"""Retries and placement as Sokovan's recovery handlers have them: a failed stage is tried
again after an exponential backoff with jitter, an agent given up on is excluded only for a
while, a failure no retry can fix cancels, and a session waits for what may still come (a
larger agent, its slowest kernel). A frozen clock; what would be sent is recorded."""

from datetime import timedelta

import pytest
import time_machine

from common import clock
from identity_app.keypairs import main_keypair
from identity_app.models import Domain, KeyPair, Project, ResourcePolicy
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler import schedule
from sessions_app.enums import Status
from sessions_app.lifecycle import progress
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.lifecycle.create import create_session
from sessions_app.models import Kernel, Session, SessionEvent
from tests.factories import make_agent, make_session, walk

S = Status
START = clock.parse("2026-01-01T10:00:00+00:00")
pytestmark = pytest.mark.usefixtures("sent")


@pytest.fixture
def frozen():
    with time_machine.travel(START, tick=False) as traveller:
        yield traveller


def at(frozen, seconds):
    frozen.move_to(START + timedelta(seconds=seconds))


def sends(sent, task):
    return [kwargs for name, kwargs in sent if name == task]


def group(**fields):
    ScalingGroup.objects.filter(name="default").update(**fields)


@pytest.fixture
def full_jitter(monkeypatch):
    """The jitter at its top: each wait is the whole backoff."""
    monkeypatch.setattr(progress.random, "random", lambda: 1.0)


class _Group:
    retry_backoff, retry_backoff_max = 2, 60


@pytest.mark.parametrize(("attempt", "low", "high"), [
    (1, 1, 2), (2, 2, 4), (3, 4, 8), (5, 16, 32), (6, 30, 60), (12, 30, 60)])
def test_the_backoff_doubles_each_try_up_to_its_cap_with_jitter_between_half_and_all(
        attempt, low, high):
    assert progress.retry_delay(_Group, attempt, rand=lambda: 0.0) == low
    assert progress.retry_delay(_Group, attempt, rand=lambda: 1.0) == high


def test_a_failed_pull_is_tried_again_after_the_backoff_and_once(
        alice, frozen, full_jitter, sent, django_capture_on_commit_callbacks):
    group(retry_backoff=4)
    session = make_session(alice, S.PULLING, agent=make_agent("a1"))
    kernel = session.kernels.get()
    with django_capture_on_commit_callbacks(execute=True):
        assert handle_kernel_event(kernel.pk, "pull_failed", {
            "error": "dial tcp 127.0.0.1:5000: connection refused", "kind": "transient"}) \
            == "retried"
    # Not at once: a countdown task for when the try is due, and nothing to the agent yet.
    assert sends(sent, "agent.check_and_pull") == []
    [(name, countdown)] = [(n, kw) for n, kw in sent if n == "scheduling.retry_kernel"]
    kernel.refresh_from_db()
    assert kernel.status_data["next_retry"] == (START + timedelta(seconds=4)).isoformat()
    event = SessionEvent.objects.get(session=session, name="kernel_retry_preparing")
    assert event.data["try"] == 2 and event.data["of"] == 3
    assert event.data["at"] == kernel.status_data["next_retry"]
    # The owner sees why it waits and until when.
    session = Session.objects.prefetch_related("kernels").get(pk=session.pk)
    assert session.pending_reason == (
        "main1: preparing failed (image pull failed: dial tcp 127.0.0.1:5000: connection "
        "refused); try 2 of 3 at 2026-01-01T10:00:04+00:00")
    assert progress.send_retry(kernel.pk) is None  # not due yet
    at(frozen, 4)
    with django_capture_on_commit_callbacks(execute=True):
        assert progress.send_retry(kernel.pk) == "preparing:1"
        assert progress.send_retry(kernel.pk) is None  # once per try
        assert progress.check_progress() == 0  # the safety net sees it sent
    assert sends(sent, "agent.check_and_pull") == [
        {"kernel_id": str(kernel.pk), "image": kernel.image}]


def test_a_retry_whose_countdown_was_lost_is_sent_by_the_progress_check(
        alice, frozen, full_jitter, sent, django_capture_on_commit_callbacks):
    session = make_session(alice, S.CREATING, agent=make_agent("a1"))
    kernel = session.kernels.get()
    handle_kernel_event(kernel.pk, "creation_failed", {"error": "boom", "kind": "transient"})
    at(frozen, 3)
    with django_capture_on_commit_callbacks(execute=True):
        assert progress.check_progress() == 1
    assert [s["spec"]["kernel_id"] for s in sends(sent, "agent.create_kernel")] == [
        str(kernel.pk)]


def test_each_next_try_waits_twice_as_long_then_the_agent_is_excluded_for_a_while(
        alice, frozen, full_jitter, sent):
    group(retry_backoff=2, exclusion_timeout=300)
    session = make_session(alice, S.CREATING, agent=make_agent("a1"))
    kernel = session.kernels.get()
    waits = []
    for n in (1, 2):
        assert handle_kernel_event(kernel.pk, "creation_failed",
                                   {"error": f"boom {n}", "kind": "transient"}) == "retried"
        kernel.refresh_from_db()
        waits.append((clock.parse(kernel.status_data["next_retry"]) - clock.now()).seconds)
    assert waits == [2, 4]
    assert handle_kernel_event(kernel.pk, "creation_failed",
                               {"error": "boom 3", "kind": "transient"}) == "rescheduled"
    session.refresh_from_db()
    assert session.status == S.PENDING
    assert session.status_data["excluded_agents"] == {
        "a1": (START + timedelta(seconds=300)).isoformat()}
    # A one-agent group: the session waits, saying until when, and starts there again once
    # the exclusion has expired (a registry back after a short outage).
    schedule("default")
    session.refresh_from_db()
    assert session.status == S.PENDING
    assert "tried again from 2026-01-01T10:05:00+00:00" in session.pending_reason
    at(frozen, 301)
    assert schedule("default") == [session.pk]


def test_an_agent_that_cannot_run_the_kernel_is_left_at_once_without_retries(
        alice, frozen, sent):
    make_agent("a1")
    session = make_session(alice, S.CREATING)
    kernel = session.kernels.get()
    assert handle_kernel_event(kernel.pk, "creation_failed", {
        "error": "folder-mounts: storage folder 'data' is not on this host",
        "kind": "agent"}) == "rescheduled"
    session.refresh_from_db()
    assert session.status == S.PENDING
    assert list(session.status_data["excluded_agents"]) == ["a1"]
    assert session.kernels.get().status_info.startswith(
        "creating failed on agent a1, which cannot run it: failed-to-start: folder-mounts")


@pytest.mark.parametrize("status, report", [
    (S.PULLING, "pull_failed"), (S.CREATING, "creation_failed")])
def test_a_failure_no_retry_can_fix_cancels_a_session_that_never_ran(
        status, report, alice, sent, django_capture_on_commit_callbacks):
    session = make_session(alice, status, cluster_size=2)
    main, sub = session.kernels.order_by("cluster_role")
    error = 'exec: "jupyter": executable file not found in $PATH'
    with django_capture_on_commit_callbacks(execute=True):
        handle_kernel_event(main.pk, report, {"error": error})  # an older agent: no kind
    session.refresh_from_db()
    assert session.status == S.CANCELLED
    stage = "preparing" if status == S.PULLING else "creating"
    assert {k.status for k in session.kernels.all()} == {S.CANCELLED}
    assert session.kernels.get(pk=main.pk).status_info.startswith(f"{stage} failed: ")
    assert not sends(sent, "agent.destroy_kernel")  # no container was made
    assert main_keypair(alice).concurrency_used == 0


def test_a_session_too_large_for_every_agent_waits_with_the_reason_until_its_pending_timeout(
        alice, frozen, sent):
    group(pending_timeout=600)
    make_agent("small", slots={"cpu": "2", "mem": "4g"})
    session = make_session(alice, resources={"cpu": "8", "mem": "1g"})
    schedule("default")
    session.refresh_from_db()
    assert session.status == S.PENDING
    assert session.pending_reason == ("asks for more cpu than any agent of scaling group "
                                      "default has; it waits for an agent that large to join")
    make_agent("big", slots={"cpu": "16", "mem": "32g"})  # one joins
    assert schedule("default") == [session.pk]
    late = make_session(alice, name="late", resources={"cpu": "64", "mem": "1g"})
    schedule("default")
    at(frozen, 601)
    assert progress.sweep_pending() == 1
    late.refresh_from_db()
    assert (late.status, late.status_info) == (S.CANCELLED, "pending-timeout")


def test_the_default_scaling_group_has_a_pending_timeout(db):
    assert ScalingGroup.objects.get(name="default").pending_timeout == 86400


def test_a_prepared_kernel_waits_for_its_sibling_still_pulling(
        alice, frozen, sent, django_capture_on_commit_callbacks):
    group(prepared_timeout=300, pull_timeout=600)
    ready, slow = make_agent("ready"), make_agent("slow")
    session = make_session(alice, S.PENDING, cluster_size=2, cluster_mode="multi-node")
    main, sub = session.kernels.order_by("cluster_role")
    walk(main, S.PREPARED, ready)
    walk(sub, S.PULLING, slow)
    at(frozen, 301)
    assert progress.check_progress() == 0  # the pull has 600 s of its own
    at(frozen, 601)
    with django_capture_on_commit_callbacks(execute=True):
        progress.check_progress()
    sub.refresh_from_db()
    main.refresh_from_db()
    assert sub.status_data["retries"] == {"preparing": 1}  # the slow one is retried
    assert main.status == S.PREPARED  # the ready one keeps its place


def test_a_prepared_session_whose_start_was_lost_is_rescheduled_without_blaming_its_agent(
        alice, frozen, sent, django_capture_on_commit_callbacks):
    group(prepared_timeout=300)
    make_agent("a1")
    session = make_session(alice, S.PREPARED)
    at(frozen, 301)
    with django_capture_on_commit_callbacks(execute=True):
        assert progress.check_progress() == 1
    session.refresh_from_db()
    assert session.status == S.PENDING
    assert "excluded_agents" not in session.status_data


def _limit_concurrency(owner, **limits):
    keypair = main_keypair(owner)
    if "user" in limits:
        ResourcePolicy.objects.filter(pk=keypair.resource_policy_id).update(
            max_concurrent_sessions_per_user=limits["user"])
    if "project" in limits:
        Project.objects.update(max_concurrent_sessions=limits["project"])
    if "domain" in limits:
        Domain.objects.update(max_concurrent_sessions=limits["domain"])


@pytest.mark.parametrize(("limit", "reason"), [
    ("user", "you run 1 sessions over all your keypairs, the most your resource policy "
             "allows a user at once (1)"),
    ("project", "your project runs 1 sessions, the most it allows at once (1)"),
    ("domain", "your domain runs 1 sessions, the most it allows at once (1)"),
])
def test_concurrency_is_limited_per_user_project_and_domain_each_with_its_reason(
        limit, reason, alice, bob, sent):
    make_agent("a1")
    _limit_concurrency(alice, **{limit: 1})
    first = make_session(alice, name="first")
    # Alice's second keypair counts for the user limit; Bob (same project and domain)
    # counts for the project and domain limits.
    other = alice if limit == "user" else bob
    second_keypair = main_keypair(other)
    if limit == "user":
        second_keypair = KeyPair.objects.create(
            user=alice, resource_policy=main_keypair(alice).resource_policy)
    second = create_session(keypair=second_keypair, user=other, name="second",
                            image="bai-local/busybox:latest",
                            resources={"cpu": "1", "mem": "256m"})
    assert schedule("default") == [first.pk]
    second.refresh_from_db()
    assert second.status == S.PENDING and second.pending_reason == reason
    Kernel.objects.filter(session=first).update(status=S.TERMINATED)
    Session.objects.filter(pk=first.pk).update(status=S.TERMINATED)
    assert schedule("default") == [second.pk]


def test_placement_prefers_an_agent_that_holds_the_image(alice, sent):
    # Concentrated placement would take the fuller agent; it lacks the image.
    full = make_agent("full", images=[])
    make_agent("holder", images=["bai-local/busybox:latest"])
    filler = make_session(alice, name="filler")
    walk(filler.kernels.get(), S.RUNNING, full)
    session = make_session(alice, name="new")
    assert schedule("default") == [session.pk]
    assert session.kernels.get().agent_id == "holder"
