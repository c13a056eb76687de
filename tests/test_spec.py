"""One session spec: the same limits and the same refusals by every interface."""

import pytest

from identity_app.keypairs import main_keypair
from identity_app.models import ResourcePolicy
from sessions_app.models import Session
from sessions_app.spec import DestroyRefused, DomainError, SessionRequestError, SessionSpec
from tests.signing import signed_call

IMAGE = "bai-local/busybox:latest"


def build(keypair, **fields):
    return SessionSpec.build(keypair=keypair, **{"name": "s", "image": IMAGE, **fields})


def test_a_spec_holds_the_validated_fields_with_the_policy_defaults(alice):
    keypair = main_keypair(alice)
    spec = build(keypair, resources={"cpu": "2", "mem": "1g"}, cluster_size=2)
    assert spec.slots.to_json() == {"cpu": "2", "mem": str(2**30)}
    assert spec.priority == keypair.resource_policy.default_priority
    assert spec.scaling_group.name == "default" and spec.project.name == "default"


def test_every_wrong_field_is_named_at_once(alice):
    with pytest.raises(SessionRequestError) as refused:
        build(main_keypair(alice), name="bad name!", session_type="batch", cluster_size=0,
              grace_period=-1, scaling_group="nowhere")
    assert set(refused.value.errors) == {"name", "startup_command", "cluster_size",
                                         "grace_period", "scaling_group"}
    assert refused.value.field == "name" and refused.value.status_code == 400


@pytest.mark.parametrize("value", [True, 1.5, "10", 2**40])
def test_numbers_must_be_whole_numbers_in_range(alice, value):
    with pytest.raises(SessionRequestError, match="grace_period must be a whole number"):
        build(main_keypair(alice), grace_period=value)


def test_the_grace_period_limit_is_one_setting_for_the_api_and_the_form(
        settings, client, as_alice, alice):
    settings.MAX_GRACE_PERIOD = 100
    keypair = main_keypair(alice)
    build(keypair, grace_period=100)
    message = "grace_period must be a whole number from 0 to 100."
    with pytest.raises(SessionRequestError, match=message):
        build(keypair, grace_period=101)

    response = signed_call(client, keypair, "POST", "/api/v1/sessions/",
                           {"name": "api", "image": IMAGE, "grace_period": 101})
    assert response.status_code == 400
    assert response.json()["data"] == {"grace_period": [message]}

    response = as_alice.post("/sessions/new/", {
        "name": "form", "image": IMAGE, "session_type": "interactive", "cpu": "1",
        "mem": "128", "cluster_size": "1", "grace_period": "101"})
    assert response.context["form"].errors["grace_period"] == [
        "At most 100: the longest grace period allowed."]
    assert not Session.objects.exists()


def test_the_priority_ceiling_comes_from_the_policy(alice):
    policy = ResourcePolicy.objects.get(name="default")
    policy.default_priority, policy.max_priority = 5, 9
    policy.save()
    keypair = main_keypair(alice)
    assert build(keypair, priority=4).priority == 4
    with pytest.raises(SessionRequestError, match="only an admin may set it higher"):
        build(keypair, priority=6)
    assert build(keypair, priority=9, may_raise_priority=True).priority == 9


def test_domain_errors_are_one_family():
    assert issubclass(SessionRequestError, DomainError)
    assert issubclass(DestroyRefused, DomainError)
    assert DestroyRefused("no").status_code == 409
    assert SessionRequestError("no", "name", 429).errors == {"name": "no"}
