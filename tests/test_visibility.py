"""Every view of the URL configuration that lists or shows sessions, kernels, folders or
keypairs narrows its rows in identity_app's RestrictedViewSet, so that none can forget
whose rows it shows."""

import pytest
from django.urls import URLResolver, get_resolver
from rest_framework import viewsets
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from accounting_app.models import UsageRecord
from identity_app.api.viewsets import RestrictedViewSet
from identity_app.models import KeyPair
from scheduling_app.models import ScalingGroup
from sessions_app.enums import Status
from sessions_app.models import Kernel, Session
from storage_app.models import Folder
from tests.factories import make_session

RESTRICTED = {Session: "user", Kernel: "session__user", Folder: "user", KeyPair: "user",
              UsageRecord: "user"}


def views_in(patterns, prefix=""):
    """(route, view class) of every class-based view under `patterns`."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from views_in(pattern.url_patterns, route)
            continue
        view = getattr(pattern.callback, "cls", None) or getattr(
            pattern.callback, "view_class", None)
        if view is not None:
            yield route, view


def model_of(view):
    return getattr(getattr(view, "queryset", None), "model", None)


def unrestricted(view):
    """Why `view` may show rows of sessions, kernels, folders or keypairs to anyone, or
    None when it goes through RestrictedViewSet."""
    if model_of(view) not in RESTRICTED:
        return None
    if not issubclass(view, RestrictedViewSet):
        return "is not a RestrictedViewSet"
    if view.get_queryset is not RestrictedViewSet.get_queryset:
        return "overrides get_queryset (narrow instead)"
    return None


def restricted_views():
    found = {}
    for route, view in views_in(get_resolver().url_patterns):
        if model_of(view) in RESTRICTED:
            found.setdefault(view, route)
    return found


def test_every_view_of_sessions_kernels_folders_and_keypairs_is_restricted():
    found = restricted_views()
    assert {model_of(view) for view in found} == set(RESTRICTED)  # the walk sees them all
    assert [f"{route}: {view.__name__} {why}" for view, route in found.items()
            if (why := unrestricted(view))] == []


def test_every_generic_view_names_its_model():
    """A generic view without a queryset could read any rows in get_queryset, unseen by
    the walk above."""
    assert [f"{route}: {view.__name__}"
            for route, view in views_in(get_resolver().url_patterns)
            if issubclass(view, GenericAPIView) and model_of(view) is None] == []


def test_the_check_refuses_a_view_that_forgets():
    class Forgetful(viewsets.ReadOnlyModelViewSet):
        queryset = Session.objects.all()

    class Overriding(RestrictedViewSet):
        queryset = Kernel.objects.all()

        def get_queryset(self):
            return Kernel.objects.all()

    class Plain(RestrictedViewSet):
        queryset = Folder.objects.all()

    assert unrestricted(Forgetful) == "is not a RestrictedViewSet"
    assert unrestricted(Overriding) == "overrides get_queryset (narrow instead)"
    assert unrestricted(Plain) is None


@pytest.mark.django_db
def test_each_restricted_view_shows_a_user_only_their_own(alice, bob, carol):
    make_session(alice, Status.RUNNING, name="mine")
    make_session(bob, Status.RUNNING, name="theirs")
    group = ScalingGroup.objects.get(name="default")
    Folder.objects.create(name="mine", user=alice, scaling_group=group)
    Folder.objects.create(name="theirs", user=bob, scaling_group=group)

    def rows(view, user):
        request = Request(APIRequestFactory().get("/"))
        request.user, request.auth = user, None
        instance = view(request=request, action="list", kwargs={}, format_kwarg=None)
        return instance.get_queryset()

    for view in restricted_views():
        owner = RESTRICTED[model_of(view)]
        owners = set(rows(view, alice).values_list(owner, flat=True))
        assert owners == {alice.pk}, view.__name__
        assert bob.pk in set(rows(view, carol).values_list(owner, flat=True)), view.__name__
