"""Read, never imported: tests/test_layering.py checks this file as if it were the state
engine (sessions_app.engine), to show that the layering check catches an engine that
reaches up to the lifecycle at module level, or to idle culling inside a function."""

from sessions_app.lifecycle.destroy import destroy_session  # noqa: F401


def cull_later():
    from scheduling_app.idle import check_idle

    return check_idle
