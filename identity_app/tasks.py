"""Thin Celery tasks of identity_app; beat fires them periodically."""

from celery import shared_task

from identity_app import audit


@shared_task(name="identity.purge_audit_log", ignore_result=True)
def purge_audit_log():
    return audit.purge_old_entries()
