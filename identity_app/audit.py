"""The audit log: who did what to what, for whom, from where, with which result.

Rows are written where the acts happen once (the lifecycle's create, destroy, stop,
resume and restart; model signals for keypairs, policies, scaling groups and folder
grants; the admin's LogEntry; the login signals and the keypair signature check), so that
every interface that reaches them is on the record. The request being served (its user,
its keypair, its address) is taken from a context variable that AuditContextMiddleware
sets; outside a request (Celery tasks, management commands) the actor is the system.
"""

import contextvars
import ipaddress
import json
import logging
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError

from common import clock
from identity_app.models import AuditEntry, KeyPair

log = logging.getLogger(__name__)
_request = contextvars.ContextVar("audit_request", default=None)

OK, REFUSED, ERROR = "ok", "refused", "error"


class AuditContextMiddleware:
    """Makes the request being served known to the audit rows its acts write."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)


def current_request():
    return _request.get()


def _trusted(address):
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(net, strict=False)
               for net in settings.AUDIT_TRUSTED_PROXIES)


def client_address(request):
    """The client's address: REMOTE_ADDR, or, when that is a trusted proxy, the nearest
    X-Forwarded-For address that is not one (the left part of the header is whatever the
    client wrote, so only what trusted proxies appended counts)."""
    if request is None:
        return None
    address = request.META.get("REMOTE_ADDR") or None
    if address and _trusted(address):
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        for hop in reversed([h for h in hops if h]):
            address = hop
            if not _trusted(hop):
                break
    try:
        return str(ipaddress.ip_address(address)) if address else None
    except ValueError:
        return None


def _request_keypair(request):
    auth = getattr(request, "auth", None)
    if isinstance(auth, KeyPair):
        return auth
    acting = getattr(request, "acting", None)
    return acting.keypair if acting is not None else None


def record(action, *, result=OK, target_type="", target_id="", user=None, keypair=None,
           username="", access_key="", on_behalf_of="", message="", data=None,
           request=None):
    """One audit row. `user`/`keypair` default to the request's; `username` names an actor
    that is no user row (a failed login's name, "system")."""
    request = request if request is not None else current_request()
    if request is not None and not username:  # a named actor is not the request's user
        if user is None:
            found = getattr(request, "user", None)
            user = found if found is not None and found.is_authenticated else None
        if keypair is None:
            keypair = _request_keypair(request)
    if user is not None and not getattr(user, "pk", None):
        user = None
    if not username:
        username = user.get_username() if user is not None else "system"
    return AuditEntry.objects.create(
        at=clock.now(), user=user, username=username[:150],
        access_key=keypair.access_key if keypair is not None else access_key[:20],
        on_behalf_of=str(on_behalf_of or "")[:150], address=client_address(request),
        action=action, target_type=target_type, target_id=str(target_id or "")[:64],
        result=result, message=str(message or "")[:2000], data=data or {})


def result_of(exc):
    """A refusal (the request's fault: an answer under 500) or an error."""
    status = getattr(exc, "status_code", None)
    return REFUSED if isinstance(status, int) and status < 500 else ERROR


def _message(exc):
    return getattr(exc, "message", None) or getattr(exc, "detail", None) or str(exc)


@contextmanager
def audited(action, **fields):
    """Records `action` when the block ends: ok, refused or error (with the exception's
    message, which is raised on). The block may fill in the yielded dict's fields (the
    target of a create is known only at its end). Use it outside the act's transaction, so
    that a refusal's row is not rolled back with the act."""
    fields = dict(fields)
    try:
        yield fields
    except Exception as exc:
        fields.update(result=result_of(exc), message=_message(exc))
        _record_quietly(action, fields)
        raise
    _record_quietly(action, fields)


def _record_quietly(action, fields):
    # The audit row must never turn an act's answer into a 500; a database that cannot
    # take it has already failed the act itself.
    try:
        record(action, **fields)
    except DatabaseError:
        log.exception("audit row for %s not written", action)


def as_json_line(entry):
    return json.dumps({
        "id": entry.pk, "at": entry.at.isoformat(), "user": entry.username,
        "user_id": entry.user_id, "access_key": entry.access_key,
        "on_behalf_of": entry.on_behalf_of, "address": entry.address,
        "action": entry.action, "target_type": entry.target_type,
        "target_id": entry.target_id, "result": entry.result, "message": entry.message,
        "data": entry.data}, sort_keys=True)


def purge_old_entries(now=None):
    """Deletes rows older than AUDIT_LOG_RETENTION_DAYS (0 keeps all); returns how many."""
    days = settings.AUDIT_LOG_RETENTION_DAYS
    if not days:
        return 0
    cutoff = (now or clock.now()) - timedelta(days=days)
    return AuditEntry.objects.filter(at__lt=cutoff).delete()[0]
