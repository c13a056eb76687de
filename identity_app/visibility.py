"""Who sees which row: the QuerySets of what users own (sessions, kernels, session
templates, keypairs, folders) answer `visible_to(user, keypair)`, and `restrict(actor)`
with the Actor of identity_app.acting; identity_app.api.viewsets applies it to every list
and detail of the API."""

from django.db import models

from identity_app.roles import is_admin


class RestrictedQuerySet(models.QuerySet):
    """A QuerySet that knows what a user, acting through a keypair, may see."""

    def visible_to(self, user, keypair=None):
        raise NotImplementedError

    def restrict(self, actor):
        return self.visible_to(actor.user, actor.keypair)


class OwnedQuerySet(RestrictedQuerySet):
    """visible_to() of what one user owns; `owner` is the lookup of the user a row
    belongs to."""

    owner = "user"

    def visible_to(self, user, keypair=None):
        """Every row for admins (`keypair` is the one the request acts through); a user's
        own otherwise; none for an anonymous user."""
        if is_admin(user, keypair):
            return self
        if user is None or not user.is_authenticated:
            return self.none()
        return self.filter(**{self.owner: user})
