"""Validators: small classes with one method, `check(session, snapshot)`.

A check returns None when the session passes, or a Failure. A temporary failure keeps the
session PENDING (and tells its owner why); a permanent one cancels it. The limits also say
whether they `may_fail` on a snapshot at all (False: none of its owners, projects or domains
has one), so that the prediction, which tries sessions many times over, skips them.
"""

from dataclasses import dataclass

from scheduling_app.scheduler.state import PendingSession, Snapshot
from sessions_app.enums import ClusterMode, SessionResult, SessionType, Status, StatusGroup


@dataclass(frozen=True)
class Failure:
    name: str
    msg: str
    permanent: bool = False


def _slots(names):
    return "/".join(names)


class KeypairResourceLimit:
    name = "keypair-resources"

    def may_fail(self, snap: Snapshot):
        return any(limit.total for limit in snap.keypair_limits.values())

    def check(self, session: PendingSession, snap: Snapshot):
        limit = snap.keypair_limits.get(session.keypair_id)
        if limit is None or not limit.total:
            return None
        beyond = [k for k in session.total.shortfall(limit.total) if k in limit.total]
        if beyond:
            return Failure(self.name, f"asks for more {_slots(beyond)} than the resource "
                                      "policy allows in total", permanent=True)
        short = limit.exceeded_by(session.total)
        if short:
            return Failure(self.name, f"your resource policy's limit of {_slots(short)} is in "
                                      "use by your other sessions")
        return None


class _GroupLimit:
    name = ""
    label = ""

    def limit_for(self, session, snap):
        raise NotImplementedError

    def limits(self, snap):
        raise NotImplementedError

    def may_fail(self, snap: Snapshot):
        return any(limit.total for limit in self.limits(snap).values())

    def check(self, session: PendingSession, snap: Snapshot):
        limit = self.limit_for(session, snap)
        short = limit.exceeded_by(session.total) if limit else []
        if short:
            return Failure(self.name, f"the {self.label}'s limit of {_slots(short)} is in use")
        return None


class ProjectResourceLimit(_GroupLimit):
    name, label = "project-resources", "project"

    def limit_for(self, session, snap):
        return snap.project_limits.get(session.project_id)

    def limits(self, snap):
        return snap.project_limits


class DomainResourceLimit(_GroupLimit):
    name, label = "domain-resources", "domain"

    def limit_for(self, session, snap):
        return snap.domain_limits.get(session.domain_id)

    def limits(self, snap):
        return snap.domain_limits


class Concurrency:
    """Sokovan's ConcurrencyValidator: sessions at once per keypair (its resource policy),
    per user over all their keypairs (the session's keypair's policy), per project and per
    domain; each limit with its own reason."""

    name = "concurrency"

    def may_fail(self, snap: Snapshot):
        return bool(snap.session_counts) or any(
            allowed is not None for allowed in snap.max_concurrency.values())

    def check(self, session: PendingSession, snap: Snapshot):
        allowed = snap.max_concurrency.get(session.keypair_id)
        used = snap.concurrency_used.get(session.keypair_id, 0)
        if allowed is not None and used >= allowed:
            return Failure(self.name, f"you run {used} sessions, the most your resource policy "
                                      f"allows at once ({allowed})")
        if session.user_concurrency is not None:
            used = snap.session_counts.get(("user", session.user_id), 0)
            if used >= session.user_concurrency:
                return Failure(self.name, f"you run {used} sessions over all your keypairs, "
                                          "the most your resource policy allows a user at "
                                          f"once ({session.user_concurrency})")
        for kind, key in (("project", session.project_id), ("domain", session.domain_id)):
            most = snap.session_limits.get((kind, key))
            used = snap.session_counts.get((kind, key), 0)
            if most is not None and used >= most:
                return Failure(self.name, f"your {kind} runs {used} sessions, the most it "
                                          f"allows at once ({most})")
        return None


class Dependencies:
    name = "dependencies"

    def check(self, session: PendingSession, snap: Snapshot):
        waiting = []
        for dep_id in session.dependencies:
            dep = snap.dependencies.get(dep_id)
            if dep is None:
                return Failure(self.name, f"dependency {dep_id} does not exist", permanent=True)
            if dep.session_type == SessionType.BATCH:
                if dep.status == Status.TERMINATED and dep.result == SessionResult.SUCCESS:
                    continue
                if dep.status in StatusGroup.FINISHED:
                    return Failure(self.name, f"dependency {dep_id} did not succeed",
                                   permanent=True)
            elif dep.status == Status.RUNNING:
                continue
            elif dep.status in StatusGroup.FINISHED | {Status.TERMINATING}:
                return Failure(self.name, f"dependency {dep_id} has ended", permanent=True)
            waiting.append(str(dep_id))
        if waiting:
            return Failure(self.name, f"waiting for dependencies: {', '.join(waiting)}")
        return None


class KnownImage:
    """Permanent: the image is registered, and some agent of the group can run it."""

    name = "image"

    def check(self, session: PendingSession, snap: Snapshot):
        if not any(a.schedulable for a in snap.agents.values()):
            return None  # agents report their images: without one alive, nothing is known
        architectures = snap.image_architectures.get(session.image)
        if not architectures:
            return Failure(self.name, f"unknown image {session.image}", permanent=True)
        if snap.agents and not any(a.architecture in architectures
                                   for a in snap.agents.values()):
            return Failure(self.name, f"no agent of the image's architecture "
                                      f"({', '.join(sorted(architectures))}) in scaling group "
                                      f"{snap.group}", permanent=True)
        return None


class FitsSomeAgent:
    """No agent of the group could hold the session, even empty: it waits, saying so (an
    agent that large may join; the group's pending timeout ends the wait). An agent whose
    slots are not known yet (its row made before a heartbeat reported them) may hold it:
    the session waits for it, saying so."""

    name = "agent-capacity"

    def check(self, session: PendingSession, snap: Snapshot):
        if not snap.agents:
            return None  # no agent yet is temporary: the selector says so
        if session.cluster_mode == ClusterMode.SINGLE_NODE:
            needs = [session.total]
        else:
            needs = [k.slots for k in session.kernels]
        for need in needs:
            if not any(need.fits_in(a.capacity) for a in snap.agents.values()):
                unknown = sorted(a.id for a in snap.agents.values() if not a.capacity)
                if unknown:
                    shown = ", ".join(unknown[:3]) + (
                        f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
                    return Failure(self.name, f"no agent of scaling group {snap.group} known "
                                              f"to be big enough; waiting for the slots of "
                                              f"{shown} (not reported yet)")
                short = sorted({n for a in snap.agents.values()
                                for n in need.shortfall(a.capacity)})
                # Not permanent (Backend.AI keeps it PENDING): a larger agent may join; its
                # pending timeout ends the wait.
                return Failure(self.name, f"asks for more {_slots(short)} than any agent of "
                                          f"scaling group {snap.group} has; it waits for an "
                                          "agent that large to join")
        return None


# Always run, in this order, before the configurable ones.
PERMANENT = [KnownImage(), FitsSomeAgent()]
CONFIGURABLE = {v.name: v for v in (KeypairResourceLimit(), ProjectResourceLimit(),
                                    DomainResourceLimit(), Concurrency(), Dependencies())}


def validators_for(names):
    """The configured validators of a scaling group (all when none are named)."""
    unknown = set(names or ()) - set(CONFIGURABLE)
    if unknown:
        raise ValueError(f"unknown validators: {', '.join(sorted(unknown))}")
    return PERMANENT + [CONFIGURABLE[n] for n in (names or CONFIGURABLE)]


def evaluate(session, snap, validators):
    """(failures, passed names): permanent failures first, stopping at the first one."""
    failures, passed = [], []
    for validator in validators:
        failure = validator.check(session, snap)
        if failure is None:
            passed.append(validator.name)
        else:
            failures.append(failure)
            if failure.permanent:
                return [failure], passed
    return failures, passed
