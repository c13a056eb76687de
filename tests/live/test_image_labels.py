"""Backend.AI's image labels on a real engine: the default kernel image as build_kernel_image
makes it, and an image's minimum resources as the agent reports them, held to by a create
through both clients' CLI."""

import io
import subprocess
import sys

import pytest

from agents_app.models import Image
from identity_app.keypairs import main_keypair
from sessions_app.enums import Status
from sessions_app.models import Session
from tests.support import IMAGE, ROOT, wait_for

pytestmark = pytest.mark.docker
LABELLED = "bai-local/min-resources-test:latest"
BUILT = "bai-local/labels-test:latest"


@pytest.fixture(scope="module")
def labelled_image(docker_client):
    """The default kernel image with a minimum of half a core and 256 MiB."""
    dockerfile = (f'FROM {IMAGE}\nLABEL ai.backend.kernelspec="1" '
                  'ai.backend.resource.min.cpu="0.5" ai.backend.resource.min.mem="256m"\n')
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=LABELLED, rm=True)
    yield LABELLED
    docker_client.images.remove(LABELLED, force=True)


def test_the_default_kernel_image_is_built_with_backendais_labels(docker_client):
    subprocess.run([sys.executable, "manage.py", "build_kernel_image", "--tag", BUILT,
                    "--force"], cwd=ROOT, check=True, capture_output=True)
    try:
        labels = docker_client.images.get(BUILT).labels
    finally:
        docker_client.images.remove(BUILT, force=True)
    assert {key: labels.get(key) for key in (
        "ai.backend.kernelspec", "ai.backend.base-distro", "ai.backend.runtime-type",
        "ai.backend.runtime-path", "ai.backend.resource.min.cpu",
        "ai.backend.resource.min.mem")} == {
        "ai.backend.kernelspec": "1", "ai.backend.base-distro": "static-gnu",
        "ai.backend.runtime-type": "app", "ai.backend.runtime-path": "/bin/sh",
        "ai.backend.resource.min.cpu": "0.1", "ai.backend.resource.min.mem": "16m"}


def test_a_create_below_the_images_minimum_is_refused_with_the_minimum(backendai, alice,
                                                                       labelled_image):
    wait_for(lambda: Image.objects.filter(name=labelled_image).exists(), timeout=30,
             message="the agent to report the image")
    assert Image.objects.get(name=labelled_image).min_slots == {
        "cpu": "0.5", "mem": str(256 * 2**20)}
    kp = main_keypair(alice)
    code, out = backendai(kp, "session", "create", "--name", "small", "-r", "cpu=0.5",
                          "-r", "mem=128m", labelled_image)
    assert code == 1, out
    assert "Missing or invalid API parameters." in out, out  # the SDK's error: its title
    assert "smaller than the minimum required by the image" in out
    assert "(cpu 0.5, mem 256 MiB): mem 128 MiB asked" in out
    assert not Session.objects.filter(name="small").exists()

    code, out = backendai(kp, "session", "create", "--name", "enough", "-r", "cpu=0.5",
                          "-r", "mem=256m", labelled_image, timeout=120)
    assert code == 0, out
    assert Session.objects.get(name="enough").status == Status.RUNNING
