"""An image's minimum and maximum resources (Backend.AI's ai.backend.resource.min.* and
.max.* labels): read from the labels agents report, held to by every create (the API, the
Backend.AI route, the dashboard), and where the dashboard's form starts."""

import json
import re
from decimal import Decimal

import pytest

from agents_app.management.commands.build_kernel_image import DOCKERFILE_HUB, DOCKERFILE_STATIC
from agents_app.models import Agent, Image, resource_limits
from identity_app.keypairs import main_keypair
from sessions_app.lifecycle.heartbeats import handle_heartbeat
from sessions_app.models import Session
from sessions_app.spec import SessionRequestError, SessionSpec
from tests.factories import make_agent
from tests.signing import signed_call

IMAGE = "bai-local/big:latest"
LABELS = {"ai.backend.kernelspec": "1", "ai.backend.resource.min.cpu": "1",
          "ai.backend.resource.min.mem": "512m", "ai.backend.resource.max.cpu": "4"}
MINIMUM = "Your resource request is smaller than the minimum required by the image " \
          f"{IMAGE} (cpu 1, mem 512 MiB)"


@pytest.fixture
def big_image(db):
    make_agent()
    return Image.objects.create(name=IMAGE, labels=LABELS)


def test_the_labels_give_each_slots_minimum_and_maximum():
    least, most = resource_limits({**LABELS, "ai.backend.resource.min.cuda.device": "1",
                                   "ai.backend.resource.min.bogus": "lots",
                                   "ai.backend.service-ports": "x:http:1"})
    assert least == {"cpu": 1, "mem": 512 * 2**20, "cuda.device": 1}
    assert most == {"cpu": 4}
    assert resource_limits(None) == ({}, {})


def test_a_request_below_the_minimum_or_above_the_maximum_is_refused(alice, big_image):
    keypair = main_keypair(alice)

    def build(resources):
        return SessionSpec.build(keypair=keypair, name="s", image=IMAGE, resources=resources)

    with pytest.raises(SessionRequestError) as refused:
        build({"cpu": "1", "mem": "256m"})
    assert refused.value.field == "resources" and refused.value.status_code == 400
    assert refused.value.message == f"{MINIMUM}: mem 256 MiB asked."
    with pytest.raises(SessionRequestError, match=r"larger than the maximum allowed by the "
                                                  r"image .* \(cpu 4\): cpu 8 asked"):
        build({"cpu": "8", "mem": "1g"})
    assert build({"cpu": "4", "mem": "512m"}).slots == {"cpu": 4, "mem": 512 * 2**20}


def test_cpu_and_memory_left_out_are_the_images_minimum(alice, big_image):
    keypair = main_keypair(alice)
    spec = SessionSpec.build(keypair=keypair, name="s", image=IMAGE)  # defaults: cpu 1, 256m
    assert spec.slots == {"cpu": 1, "mem": 512 * 2**20}
    spec = SessionSpec.build(keypair=keypair, name="s", image=IMAGE, resources={"cpu": "2"})
    assert spec.slots == {"cpu": 2, "mem": 512 * 2**20}
    plain = SessionSpec.build(keypair=keypair, name="s", image="bai-local/busybox:latest",
                              resources={"cpu": "0.5", "mem": "64m"})
    assert plain.slots == {"cpu": Decimal("0.5"), "mem": 64 * 2**20}  # no labels, no bounds


def test_every_interface_refuses_it_with_the_minimum_in_the_message(client, as_alice, alice,
                                                                    big_image):
    keypair = main_keypair(alice)
    body = {"name": "small", "image": IMAGE, "resources": {"cpu": "1", "mem": "256m"}}
    api = signed_call(client, keypair, "POST", "/api/v1/sessions/", body)
    assert api.status_code == 400 and MINIMUM in api.json()["msg"]

    compat = signed_call(client, keypair, "POST", "/session",
                         {"image": IMAGE, "name": "small", "enqueueOnly": True,
                          "config": {"resources": {"cpu": "1", "mem": "256m"}}})
    assert compat.status_code == 400
    assert compat.json()["type"] == "https://api.backend.ai/probs/invalid-api-params"
    assert compat.json()["title"] == "Missing or invalid API parameters."
    assert MINIMUM in compat.json()["msg"]

    form = as_alice.post("/sessions/new/", {
        "name": "small", "image": IMAGE, "session_type": "interactive", "cpu": "1",
        "mem": "256", "cluster_size": "1"})
    assert any(MINIMUM in error for error in form.context["form"].non_field_errors())
    assert not Session.objects.exists()


def test_the_create_form_starts_at_the_chosen_images_minimum(settings, as_alice, big_image):
    settings.DEFAULT_KERNEL_IMAGE = IMAGE
    page = as_alice.get("/sessions/new/").content.decode()
    cpu = re.search(r'<input[^>]*name="cpu"[^>]*>', page).group(0)
    mem = re.search(r'<input[^>]*name="mem"[^>]*>', page).group(0)
    assert 'value="1"' in cpu and 'min="1.0"' in cpu
    assert 'value="512"' in mem and 'min="512"' in mem
    minimums = re.search(r'data-minimums="([^"]*)"', page).group(1)
    assert json.loads(minimums.replace("&quot;", '"')) == {IMAGE: {"cpu": 1.0, "mem": 512}}
    assert "js/session_form.js" in page


def test_an_agents_image_report_records_its_minimum(alice, db):
    agent = make_agent()
    handle_heartbeat({"id": agent.pk, "scaling_group": "default", "addr": "127.0.0.1",
                      "images": [{"name": IMAGE, "labels": LABELS}]})
    assert Image.objects.get(name=IMAGE).min_slots == {"cpu": "1", "mem": str(512 * 2**20)}
    assert Agent.objects.filter(pk=agent.pk).exists()


@pytest.mark.parametrize("dockerfile", [DOCKERFILE_STATIC, DOCKERFILE_HUB])
def test_the_default_kernel_image_carries_backendais_standard_labels(dockerfile):
    text = dockerfile.decode()
    for label in ('ai.backend.kernelspec="1"', 'ai.backend.base-distro="static-gnu"',
                  'ai.backend.runtime-type="app"', 'ai.backend.runtime-path="/bin/sh"',
                  'ai.backend.resource.min.cpu="0.1"', 'ai.backend.resource.min.mem="16m"'):
        assert label in text
