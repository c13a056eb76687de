"""Who may do what, for DRF's views: the acting user and keypair come from
identity_app.acting, the roles from identity_app.roles."""

from rest_framework import permissions

from identity_app.acting import NotYours, actor_of
from sessions_app.api.errors import RequestFailed


def acting_keypair(request):
    """The keypair a request acts through: its signature's, or the user's main keypair."""
    return actor_of(request).keypair


def request_is_admin(request):
    return actor_of(request).is_admin


def request_is_superadmin(request):
    return actor_of(request).is_superadmin


class IsAdmin(permissions.BasePermission):
    message = "Only administrators may do this."

    def has_permission(self, request, view):
        return actor_of(request).is_admin


class AdminReadsSuperadminWrites(IsAdmin):
    """Scaling groups, resource policies, agents: admins look, superadmins change."""

    message = "Only administrators may see this, and only superadmins may change it."

    def has_permission(self, request, view):
        if not super().has_permission(request, view):
            return False
        return request.method in permissions.SAFE_METHODS or actor_of(request).is_superadmin


def owner_keypair(request, access_key=None, *, creating=False):
    """The keypair whose sessions a request acts on (Actor.owner), refusals in the API's
    error form."""
    try:
        return actor_of(request).owner(access_key, creating=creating)
    except NotYours as refused:
        raise RequestFailed(refused.message, refused.status) from None
