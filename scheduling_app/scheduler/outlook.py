"""The queue as the dashboard draws it: per scaling group, its waiting sessions at the
starts the scheduler's last pass predicted (status_data["scheduler"]), beside the sessions
holding slots and their latest ends, which those predictions rest on (timeline.py)."""

from datetime import datetime

from common.json_keys import json_key
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler.timeline import load_occupants
from sessions_app.enums import Status
from sessions_app.models import Session

OTHERS = "another user's session"


def queue_outlook(actor, now):
    """[{"name", "waiting": [...], "running": [...]}] of the scaling groups with a waiting
    session or a session holding slots. A user sees the names of their own sessions only
    (`mine` marks them); an admin sees every name."""
    user_id = actor.user.pk if actor.authenticated else None

    def shown(name, owner):
        return name if actor.is_admin or owner == user_id else OTHERS

    waiting = {}
    for pk, name, owner, group, created, record in Session.objects.filter(
            status=Status.PENDING).annotate(record=json_key("status_data__scheduler")).order_by(
            "created_at").values_list("id", "name", "user_id", "scaling_group__name",
                                      "created_at", "record"):
        record = record if isinstance(record, dict) else {}
        waiting.setdefault(group, []).append({
            "id": str(pk), "name": shown(name, owner), "mine": owner == user_id,
            "created_at": created.timestamp(), "position": record.get("queue_position"),
            "predicted_start": _epoch(record.get("predicted_start")),
            "unknown": record.get("prediction_unknown") or (
                "" if record else "not seen by the scheduler yet")})
    groups = []
    for group in ScalingGroup.objects.order_by("name"):
        running = [{"id": str(o.id), "name": shown(o.name, o.user_id),
                    "mine": o.user_id == user_id, "end": o.end.timestamp() if o.end else None}
                   for o in load_occupants(group, now)]
        queue = sorted(waiting.get(group.name, []),
                       key=lambda w: (w["position"] is None, w["position"] or 0))
        if queue or running:
            running.sort(key=lambda r: (r["end"] is None, r["end"] or 0))
            groups.append({"name": group.name, "waiting": queue, "running": running})
    return groups


def _epoch(text):
    return datetime.fromisoformat(text).timestamp() if text else None
