"""The Backend.AI manager's GraphQL type of resource presets (the schema and its queries:
sessions_app/compat/graphql.py)."""

import graphene
from graphene_django import DjangoObjectType

from scheduling_app.models import ResourcePreset


class ResourcePresetType(DjangoObjectType):
    """A resource preset, as the manager's ResourcePreset."""

    class Meta:
        model = ResourcePreset
        name = "ResourcePreset"
        fields = ("id", "name")

    resource_slots = graphene.JSONString()
    shared_memory = graphene.String()
    scaling_group_name = graphene.String()

    def resolve_resource_slots(preset, info):
        return preset.resource_slots

    def resolve_shared_memory(preset, info):
        return None if preset.shared_memory is None else str(preset.shared_memory)

    def resolve_scaling_group_name(preset, info):
        return preset.scaling_group.name if preset.scaling_group_id else None
