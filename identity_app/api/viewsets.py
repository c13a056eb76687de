"""The base of every API view that lists or shows what users own (sessions, kernels,
folders, keypairs): its queryset is narrowed here to what the acting user may see (the
model's RestrictedQuerySet), as NetBox restricts every viewset in its base class, so that a
view cannot forget it. tests/test_visibility.py checks every such view in the URL
configuration goes through it."""

from rest_framework import viewsets

from identity_app.acting import actor_of


class RestrictedViewSet(viewsets.GenericViewSet):
    """A view narrows further in `narrow` (filters, order, joins); it does not override
    get_queryset, and its get_object, if any, looks among get_queryset()."""

    def get_queryset(self):
        return self.narrow(super().get_queryset().restrict(actor_of(self.request)))

    def narrow(self, queryset):
        return queryset
