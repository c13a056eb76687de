"""Session-type hooks: one small class per type, found through a registry, called before a
session is scheduled. A new type registers a class; the scheduler needs no change."""

from django.conf import settings

REGISTRY = {}


def register(session_type):
    def decorator(cls):
        REGISTRY[session_type] = cls()
        return cls
    return decorator


class SessionTypeHook:
    def prepare(self, session) -> dict:
        """Field updates for the Session row of this PendingSession (none by default)."""
        return {}


@register("interactive")
class Interactive(SessionTypeHook):
    pass


@register("batch")
class Batch(SessionTypeHook):
    def prepare(self, session):
        if session.batch_timeout is None and settings.DEFAULT_BATCH_TIMEOUT:
            return {"batch_timeout": settings.DEFAULT_BATCH_TIMEOUT}
        return {}


@register("inference")
class Inference(SessionTypeHook):
    pass


def hook_for(session_type) -> SessionTypeHook:
    return REGISTRY.get(session_type, SessionTypeHook())
