import json

from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver

from identity_app import audit
from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.models import ScalingGroup
from storage_app.models import Folder, FolderGrant


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def give_every_user_a_main_keypair(sender, instance, created, raw=False, **kwargs):
    if created and not raw:
        main_keypair(instance)


# The audit log's model changes: every interface (API, GraphQL, admin, commands) saves
# through the model, so its signals are the one place that sees them all. The fields
# whose change is on the record, per model (never a secret; not the counters the system
# keeps, such as a keypair's concurrency_used or last_used).
AUDITED = {
    KeyPair: ("keypair", ["user_id", "is_main", "is_active", "is_admin",
                          "resource_policy_id", "rate_limit"]),
    ResourcePolicy: ("resource_policy", None),  # every field
    ScalingGroup: ("scaling_group", None),
    Folder: ("folder", ["member_permission"]),
    FolderGrant: ("folder_grant", ["folder_id", "user_id", "permission"]),
}
CREATE_AND_DELETE_ONLY_CHANGES = {Folder}  # a folder's own create/delete are not policy acts


def _fields(model, names):
    if names is not None:
        return names
    return [f.attname for f in model._meta.concrete_fields if not f.primary_key]


def _plain(values):
    return json.loads(json.dumps(values, cls=DjangoJSONEncoder))


def _owner(instance):
    if isinstance(instance, KeyPair):
        return instance.user.get_username()
    if isinstance(instance, FolderGrant):
        return instance.user.get_username()
    return ""


@receiver(pre_save)
def remember_audited_fields(sender, instance, raw=False, **kwargs):
    if sender not in AUDITED or raw or instance._state.adding:
        return
    names = _fields(sender, AUDITED[sender][1])
    instance._audit_before = sender._base_manager.filter(pk=instance.pk).values(*names).first()


@receiver(post_save)
def record_audited_save(sender, instance, created, raw=False, **kwargs):
    if sender not in AUDITED or raw:
        return
    kind, names = AUDITED[sender]
    names = _fields(sender, names)
    after = {name: getattr(instance, name) for name in names}
    if created:
        if sender in CREATE_AND_DELETE_ONLY_CHANGES:
            return
        action, data = f"{kind}.create", after
    else:
        before = getattr(instance, "_audit_before", None) or {}
        changed = {n: [before.get(n), after[n]] for n in names if before.get(n) != after[n]}
        if not changed:
            return
        action = f"{kind}.change"
        if sender is KeyPair and set(changed) == {"is_active"}:
            action = "keypair.deactivate" if not instance.is_active else "keypair.activate"
        elif sender is Folder:
            action = "folder.permission"
        data = {"changed": changed}
    audit.record(action, target_type=kind, target_id=instance.pk,
                 on_behalf_of=_owner(instance), message=str(instance), data=_plain(data))


@receiver(post_delete)
def record_audited_delete(sender, instance, **kwargs):
    if sender not in AUDITED or sender in CREATE_AND_DELETE_ONLY_CHANGES:
        return
    kind, _ = AUDITED[sender]
    try:
        owner = _owner(instance)
    except Exception:  # the owner row went first (a cascade from the user)
        owner = ""
    audit.record(f"{kind}.delete", target_type=kind, target_id=instance.pk,
                 on_behalf_of=owner, message=str(instance))


ADMIN_ACTIONS = {ADDITION: "admin.add", CHANGE: "admin.change", DELETION: "admin.delete"}


@receiver(post_save, sender=LogEntry)
def record_admin_change(sender, instance, created, raw=False, **kwargs):
    """Every change made in the Django admin (its LogEntry), whatever the model."""
    if not created or raw:
        return
    model = instance.content_type.model_class() if instance.content_type_id else None
    audit.record(ADMIN_ACTIONS.get(instance.action_flag, "admin.change"),
                 user=instance.user, username=instance.user.get_username(),
                 target_type=model._meta.label_lower if model else "",
                 target_id=instance.object_id or "", message=instance.object_repr,
                 data={"change": instance.get_change_message()},
                 request=audit.current_request())


@receiver(user_logged_in)
def record_login(sender, request, user, **kwargs):
    audit.record("login", user=user, username=user.get_username(), request=request)


@receiver(user_login_failed)
def record_failed_login(sender, credentials, request=None, **kwargs):
    audit.record("login", result=audit.REFUSED, username=credentials.get("username") or "-",
                 request=request, message="wrong username or password")


@receiver(user_locked_out)
def record_lockout(sender, request, username=None, ip_address=None, **kwargs):
    audit.record("login.locked_out", result=audit.REFUSED, username=username or "-",
                 request=request, message="too many failed logins")
