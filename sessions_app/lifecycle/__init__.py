"""The session lifecycle: what happens next to a session, in one place.

- destroy: the per-status rules of a destroy (users, admins, the system);
- stop: stop (the files kept, STOPPED) and resume, and the retention of stopped sessions;
- progress: the periodic and event-driven handlers that move kernels on, retry, reschedule
  and sweep (beat fires them through scheduling_app.tasks);
- agent_reports: what agents report about kernels (pulls, starts, exits);
- heartbeats: agent heartbeats, and reconciling their containers with the kernels;
- invariants: the checks of ARCHITECTURE.md's invariants (manage.py check_invariants).
"""

from sessions_app.lifecycle.destroy import DestroyResult, destroy_session

__all__ = ["DestroyResult", "destroy_session"]
