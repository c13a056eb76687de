"""Who may do what: superadmins (Django superusers), admins (staff, or an admin keypair) and
users, who see and touch only their own things."""

from rest_framework import permissions

from sessions_app.api.errors import RequestFailed
from sessions_app.keypairs import main_keypair
from sessions_app.models import KeyPair
from sessions_app.querysets import is_admin


def acting_keypair(request):
    """The keypair a request acts through: its signature's, or the user's main keypair."""
    if isinstance(request.auth, KeyPair):
        return request.auth
    return main_keypair(request.user)


def request_is_admin(request):
    cached = getattr(request, "_is_admin", None)
    if cached is None:
        cached = request._is_admin = is_admin(request.user, acting_keypair(request))
    return cached


def is_superadmin(user):
    return bool(user and user.is_superuser)


class IsAdmin(permissions.BasePermission):
    message = "Only administrators may do this."

    def has_permission(self, request, view):
        return bool(request.user and request.user.is_authenticated and request_is_admin(request))


class AdminReadsSuperadminWrites(IsAdmin):
    """Scaling groups, resource policies, agents: admins look, superadmins change."""

    message = "Only administrators may see this, and only superadmins may change it."

    def has_permission(self, request, view):
        if not super().has_permission(request, view):
            return False
        return request.method in permissions.SAFE_METHODS or is_superadmin(request.user)


def owner_keypair(request, access_key=None, *, creating=False):
    """The keypair whose sessions a request acts on: its own, or for admins any keypair
    named by `owner_access_key`.

    A user naming another user's keypair gets 404, as for any of that user's things; only
    for a create, where there is nothing to look up, is it a 403.
    """
    own = acting_keypair(request)
    if not access_key or access_key == own.access_key:
        return own
    keypair = KeyPair.objects.select_related("user", "resource_policy").filter(
        access_key=access_key).first()
    if keypair is not None and (keypair.user_id == request.user.pk or request_is_admin(request)):
        return keypair
    if creating and keypair is not None:
        raise RequestFailed("Only administrators may act for another keypair's owner.", 403)
    raise RequestFailed(f"There is no keypair {access_key!r} you may act for.", 404)
