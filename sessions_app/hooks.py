"""Destroy hooks. PRE_DESTROY_HOOKS (dotted paths) may refuse a destroy by raising
DestroyRefused; POST_DESTROY_HOOKS are told what happened."""

import logging

from sessions_app.spec import DestroyRefused

log = logging.getLogger(__name__)


def protect_tagged_sessions(session, forced, reason):
    """Refuse to destroy sessions tagged `protected`, forced or not."""
    if session.tag == "protected":
        raise DestroyRefused(f"Session {session.name} is protected (tag 'protected'); "
                             "remove the tag first")


def log_destroyed(session, forced, reason, result):
    log.info("session %s destroyed (%s, forced=%s): %s", session.pk, reason, forced,
             result.status)
