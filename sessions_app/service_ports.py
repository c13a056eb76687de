"""The service ports a session's image declares (its `ai.backend.service-ports` label, as
the agents report their images' labels in heartbeats)."""

from agents_app.models import Image
from agents_app.stream_tokens import service_port, service_ports


def image_labels(image):
    return Image.objects.filter(name=image).values_list("labels", flat=True).first() or {}


def of_image(image):
    return service_ports(image_labels(image))


def declared(image, name):
    return service_port(image_labels(image), name)
