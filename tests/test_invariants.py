"""Property: random sequences of transitions, agent events and destroys never break the
invariants of ARCHITECTURE.md — no illegal transition is recorded, sessions show the status
derived from their kernels, and agents' slots and keypairs' concurrency equal what the live
kernels hold."""

import contextlib
from collections import defaultdict

from django.contrib.auth import get_user_model
from django.db.models import F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase

from agents_app.models import Agent
from common.slots import ResourceSlots
from identity_app.models import KeyPair, ensure_defaults
from sessions_app import engine
from sessions_app.enums import Status, StatusGroup
from sessions_app.lifecycle import destroy_session
from sessions_app.lifecycle.agent_reports import handle_kernel_event
from sessions_app.models import Kernel, Session, SessionEvent
from sessions_app.spec import DestroyRefused
from tests.factories import make_agent, make_session

STATUSES = list(Status)
AGENT_EVENTS = ["image_pulling", "image_pulled", "pull_failed", "kernel_started",
                "creation_failed", "kernel_terminated", "teardown_failed", "pre_stop_failed"]

operations = st.lists(st.one_of(
    st.tuples(st.just("create"), st.integers(1, 2)),
    st.tuples(st.just("move"), st.integers(0, 9), st.integers(0, 1), st.sampled_from(STATUSES)),
    st.tuples(st.just("agent"), st.integers(0, 9), st.integers(0, 1),
              st.sampled_from(AGENT_EVENTS), st.sampled_from([None, 0, 1, 137])),
    st.tuples(st.just("destroy"), st.integers(0, 9), st.booleans()),
), min_size=1, max_size=30)


class InvariantTests(TestCase):
    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @example([("create", 2), ("move", 0, 0, Status.ERROR), ("destroy", 0, True)])
    @given(operations)
    def test_invariants_hold_under_random_operations(self, ops):
        ensure_defaults()
        User = get_user_model()
        alice = User.objects.create_user("alice")
        carol = User.objects.create_user("carol", is_staff=True, is_superuser=True)
        agent = make_agent(slots={"cpu": "3", "mem": "2g"})
        sessions = []
        for op in ops:
            kind = op[0]
            if kind == "create":
                sessions.append(make_session(alice, name=f"s{len(sessions)}",
                                             cluster_size=op[1]))
            elif not sessions:
                continue
            elif kind == "move":
                kernel = self.kernel(sessions, op[1], op[2])
                self.move(kernel, op[3], agent)
            elif kind == "agent":
                kernel = self.kernel(sessions, op[1], op[2])
                handle_kernel_event(kernel.pk, op[3], {"container_id": "c1", "exit_code": op[4],
                                                       "error": "boom"})
            elif kind == "destroy":
                session = Session.objects.get(pk=sessions[op[1] % len(sessions)].pk)
                with contextlib.suppress(DestroyRefused):  # refusals are part of the rules
                    destroy_session(session, forced=op[2], actor=carol)
            self.check_invariants()

    @staticmethod
    def kernel(sessions, session_index, kernel_index):
        session = sessions[session_index % len(sessions)]
        kernels = list(Kernel.objects.filter(session=session).order_by("cluster_role",
                                                                        "cluster_idx"))
        return kernels[kernel_index % len(kernels)]

    def move(self, kernel, target, agent):
        legal = target in engine.TRANSITIONS[Status(kernel.status)]
        before = kernel.status
        if not legal:
            with self.assertRaises(engine.IllegalTransition):
                engine.transition_kernel(kernel, target)
            self.assertEqual(Kernel.objects.get(pk=kernel.pk).status, before)
        elif target == Status.SCHEDULED:
            agent.refresh_from_db()
            if ResourceSlots.parse(kernel.requested_slots).fits_in(agent.free_slots):
                engine.schedule_kernel(kernel, agent)
        else:
            engine.transition_kernel(kernel, target, reason="random")

    def check_invariants(self):
        # Events that change no status (a retry, pull progress: engine.record_event) carry
        # the kernel's status as both ends; every other one must be a legal transition.
        for event in SessionEvent.objects.exclude(kernel=None).exclude(
                from_status=F("to_status")):
            self.assertIn(event.to_status, engine.TRANSITIONS[Status(event.from_status)],
                          f"illegal {event}")
        for session in Session.objects.prefetch_related("kernels"):
            statuses = [k.status for k in session.kernels.all()]
            self.assertEqual(session.status, engine.derive_session_status(statuses))
        held = defaultdict(ResourceSlots)
        for kernel in Kernel.objects.filter(status__in=StatusGroup.HOLDING_SLOTS):
            held[kernel.agent_id] = held[kernel.agent_id] + ResourceSlots.parse(
                kernel.occupied_slots)
        for agent in Agent.objects.all():
            self.assertTrue((ResourceSlots.parse(agent.occupied_slots) - held[agent.pk])
                            .is_zero(), f"{agent.occupied_slots} != {held[agent.pk]}")
        live = Kernel.objects.filter(status__in=StatusGroup.HOLDING_CONCURRENCY,
                                     cluster_role="main").count()
        self.assertEqual(sum(KeyPair.objects.values_list("concurrency_used", flat=True)), live)
