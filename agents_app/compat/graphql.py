"""The Backend.AI manager's GraphQL type of images (the schema and its queries:
sessions_app/compat/graphql.py)."""

import graphene
from graphene_django import DjangoObjectType

from agents_app.models import Image
from common.devices import kind_of


class KVPair(graphene.ObjectType):
    key = graphene.String()
    value = graphene.String()


class ImageType(DjangoObjectType):
    """An image, as the manager's Image: `name` without the tag, which is `tag`."""

    class Meta:
        model = Image
        name = "Image"
        fields = ("id", "architecture")

    name = graphene.String()
    humanized_name = graphene.String()
    tag = graphene.String()
    registry = graphene.String()
    is_local = graphene.Boolean()
    digest = graphene.String()
    labels = graphene.List(KVPair)
    aliases = graphene.List(graphene.String)
    size_bytes = graphene.Float()
    resource_limits = graphene.JSONString()
    supported_accelerators = graphene.List(graphene.String)
    installed = graphene.Boolean()
    installed_agents = graphene.List(graphene.String)
    hash = graphene.String()
    last_used_at = graphene.DateTime()

    def resolve_name(image, info):
        return image.name.rpartition(":")[0] if ":" in _last_part(image) else image.name

    def resolve_humanized_name(image, info):
        return image.name

    def resolve_tag(image, info):
        return image.name.rpartition(":")[2] if ":" in _last_part(image) else "latest"

    def resolve_registry(image, info):
        return image.registry or "local"

    def resolve_is_local(image, info):
        return not image.registry

    def resolve_digest(image, info):
        return image.labels.get("digest", "") if isinstance(image.labels, dict) else ""

    resolve_hash = resolve_digest

    def resolve_labels(image, info):
        labels = image.labels if isinstance(image.labels, dict) else {}
        return [KVPair(key=key, value=str(value)) for key, value in sorted(labels.items())]

    def resolve_aliases(image, info):
        return []

    def resolve_size_bytes(image, info):
        return 0  # agents report no sizes; 23.9.10's formatter cannot print a null

    def resolve_resource_limits(image, info):
        return image.min_slots

    def resolve_supported_accelerators(image, info):
        """Its ai.backend.accelerators label, and the kinds of device it needs."""
        named = (image.labels or {}).get("ai.backend.accelerators") or ""
        return sorted({kind.strip() for kind in named.split(",") if kind.strip()}
                      | {kind_of(slot) for slot in image.min_slots or {} if kind_of(slot)})

    def resolve_installed(image, info):
        return True

    def resolve_installed_agents(image, info):
        return []

    def resolve_last_used_at(image, info):
        return None


def _last_part(image):
    return image.name.rsplit("/", 1)[-1]
