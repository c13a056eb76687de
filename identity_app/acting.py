"""Who acts, for which owner, with which rights: the one resolver every interface asks (the
REST API, the Backend.AI routes, GraphQL, the websockets, the stream and app proxy, the
storage API, the dashboard).

The acting keypair is the one a request is signed with (the Backend.AI routes, the SDK), else
the user's main keypair (a browser session, the dashboard, its websockets). Being an admin
depends on it: a user acting through an admin keypair is an admin for that request only.
"""

from dataclasses import dataclass
from functools import cached_property

from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair
from identity_app.roles import is_admin, is_superadmin


class NotYours(Exception):
    """A keypair the actor may not act for: `status` 404 (not there for them) or 403."""

    def __init__(self, message, status):
        super().__init__(message)
        self.message, self.status = message, status


@dataclass(eq=False)
class Actor:
    """A user (None or anonymous: nobody) and the keypair they act through."""

    user: object
    keypair: KeyPair | None

    @property
    def authenticated(self):
        return bool(self.user is not None and self.user.is_authenticated)

    @cached_property
    def is_admin(self):
        return self.authenticated and is_admin(self.user, self.keypair)

    @property
    def is_superadmin(self):
        return self.authenticated and is_superadmin(self.user)

    def owner(self, access_key=None, *, creating=False):
        """The keypair whose things the actor acts on: its own, or for admins any keypair
        named by `access_key` (Backend.AI's owner_access_key).

        A user naming another user's keypair gets 404, as for any of that user's things;
        only for a create, where there is nothing to look up, is it a 403.
        """
        if not access_key or access_key == self.keypair.access_key:
            return self.keypair
        keypair = KeyPair.objects.select_related("user", "resource_policy").filter(
            access_key=access_key).first()
        if keypair is not None and (keypair.user_id == self.user.pk or self.is_admin):
            return keypair
        if creating and keypair is not None:
            raise NotYours("Only administrators may act for another keypair's owner.", 403)
        raise NotYours(f"There is no keypair {access_key!r} you may act for.", 404)


def actor_for(user, keypair=None):
    """The Actor of `user` acting through `keypair`, by default their main keypair."""
    if user is None or not user.is_authenticated:
        return Actor(user, None)
    return Actor(user, keypair if keypair is not None else main_keypair(user))


def actor_of(request):
    """The Actor of a request (DRF's or Django's), resolved once per request: its signature's
    keypair (`request.auth`), else the logged-in user's main keypair."""
    # DRF's Request wraps Django's: keep it on the one underneath, which both see.
    plain = getattr(request, "_request", request)
    found = getattr(plain, "acting", None)
    auth = getattr(request, "auth", None)
    signed = auth if isinstance(auth, KeyPair) else None
    if found is None or (signed is not None and found.keypair != signed):
        found = plain.acting = actor_for(request.user, signed)
    return found
