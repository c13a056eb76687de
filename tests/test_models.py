import pytest
from django.db import IntegrityError, transaction

from identity_app.keypairs import main_keypair
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.models import default_of
from sessions_app.enums import Status
from sessions_app.models import Session
from tests.factories import make_session


def test_every_user_gets_a_main_keypair_however_created(defaults, django_user_model):
    made = [
        django_user_model.objects.create_user("u1"),
        django_user_model.objects.create_superuser("u2", "", "pw-long-enough"),
        django_user_model.objects.create(username="u3"),
    ]
    for user in made:
        keypair = KeyPair.objects.get(user=user, is_main=True)
        assert len(keypair.access_key) == 20 and len(keypair.secret_key) == 40
        assert keypair.resource_policy == default_of(ResourcePolicy)
    assert KeyPair.objects.get(user=made[1]).is_admin


def test_a_user_has_only_one_main_keypair(alice):
    with pytest.raises(IntegrityError), transaction.atomic():
        KeyPair.objects.create(user=alice, is_main=True,
                               resource_policy=default_of(ResourcePolicy))
    assert main_keypair(alice) == main_keypair(alice)


def test_session_name_is_unique_among_the_owners_live_sessions_only(alice, bob):
    first = make_session(alice, Status.RUNNING, name="same")
    make_session(bob, Status.PENDING, name="same")  # another owner may use the name
    with pytest.raises(IntegrityError), transaction.atomic():
        Session.objects.create(
            name="same", keypair=first.keypair, user=alice, domain=first.domain,
            project=first.project, scaling_group=first.scaling_group, image="x",
        )
    Session.objects.filter(pk=first.pk).update(status=Status.TERMINATED)
    make_session(alice, Status.PENDING, name="same")  # free again once finished


def test_cluster_size_must_be_positive(alice):
    session = make_session(alice)
    with pytest.raises(IntegrityError), transaction.atomic():
        Session.objects.filter(pk=session.pk).update(cluster_size=0)


def test_status_values_are_exactly_the_lifecycle():
    assert list(Status.values) == [
        "PENDING", "SCHEDULED", "PREPARING", "PULLING", "PREPARED", "CREATING", "RUNNING",
        "TERMINATING", "TERMINATED", "CANCELLED", "ERROR", "STOPPED"]
