"""The DRF API of agents (admins read them) and images (users: not those committed from
other users' sessions)."""

from rest_framework import serializers, viewsets

from agents_app.models import Agent, Image
from identity_app.api.permissions import AdminReadsSuperadminWrites, request_is_admin


class AgentSerializer(serializers.ModelSerializer):
    free_slots = serializers.SerializerMethodField()

    class Meta:
        model = Agent
        fields = ["id", "status", "scaling_group", "schedulable", "available_slots",
                  "occupied_slots", "free_slots", "addr", "region", "architecture", "version",
                  "first_contact", "last_heartbeat", "lost_at", "docker_error", "devices"]

    def get_free_slots(self, agent) -> dict:
        return agent.free_slots.clamp_negative().to_json()


class AgentViewSet(viewsets.ReadOnlyModelViewSet):
    """Agents and their slots (admins)."""

    queryset = Agent.objects.order_by("id")
    serializer_class = AgentSerializer
    permission_classes = [AdminReadsSuperadminWrites]


class ImageSerializer(serializers.ModelSerializer):
    class Meta:
        model = Image
        fields = ["id", "name", "architecture", "registry", "labels", "min_slots"]


class ImageViewSet(viewsets.ReadOnlyModelViewSet):
    """Kernel images the agents have reported (a user's: not those committed from other
    users' sessions)."""

    queryset = Image.objects.order_by("name", "architecture")
    serializer_class = ImageSerializer

    def get_queryset(self):
        admin = request_is_admin(self.request)
        return super().get_queryset().usable_by(None if admin else self.request.user.pk)
