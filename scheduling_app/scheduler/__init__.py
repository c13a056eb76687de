"""The scheduler: plugins on plain data (predicates, sequencers, selectors), the pass that
runs them (core), and the handlers that move placed sessions on (handlers)."""

from scheduling_app.scheduler.core import dry_run, run_pass, schedule

__all__ = ["dry_run", "run_pass", "schedule"]
