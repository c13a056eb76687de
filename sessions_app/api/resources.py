"""The DRF API of everything around sessions: kernels, agents, images, keypairs, scaling
groups and resource policies. Users read their own kernels and keypairs and the images;
admins read everything; superadmins change scaling groups and resource policies."""

import contextlib
import uuid

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.response import Response

from agents_app.models import Agent, Image
from common.slots import ResourceSlots, SlotError
from identity_app.api.permissions import (
    AdminReadsSuperadminWrites,
    request_is_admin,
)
from identity_app.api.viewsets import RestrictedViewSet
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.idle import CHECKERS
from scheduling_app.models import ScalingGroup, default_of
from scheduling_app.scheduler.predicates import CONFIGURABLE
from sessions_app.api.errors import RequestFailed
from sessions_app.api.views import KernelSerializer
from sessions_app.models import Kernel


class KernelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, RestrictedViewSet):
    """Kernels of the sessions you may see; `?session=ID` for one session's."""

    queryset = Kernel.objects.all()
    serializer_class = KernelSerializer
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"

    def narrow(self, kernels):
        kernels = kernels.order_by("-created_at", "cluster_role", "cluster_idx")
        session = self.request.query_params.get("session")
        if session:
            kernels = kernels.filter(session__pk__in=_uuids(session))
        return kernels


def _uuids(text):
    found = []
    for part in text.split(","):
        with contextlib.suppress(ValueError):
            found.append(uuid.UUID(part.strip()))
    return found


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


class KeyPairSerializer(serializers.ModelSerializer):
    user = serializers.SlugRelatedField(slug_field="username",
                                        queryset=get_user_model().objects.all())
    resource_policy = serializers.SlugRelatedField(
        slug_field="name", queryset=ResourcePolicy.objects.all(), required=False)

    class Meta:
        model = KeyPair
        fields = ["access_key", "user", "is_main", "is_active", "is_admin", "resource_policy",
                  "concurrency_used", "rate_limit", "last_used", "created_at"]
        read_only_fields = ["access_key", "is_main", "concurrency_used", "last_used",
                            "created_at"]
        extra_kwargs = {"rate_limit": {"min_value": 1, "max_value": 2**31 - 1}}


class KeyPairUpdateSerializer(KeyPairSerializer):
    user = serializers.CharField(source="user.username", read_only=True)  # never moves


class KeyPairCreatedSerializer(KeyPairSerializer):
    class Meta(KeyPairSerializer.Meta):
        fields = KeyPairSerializer.Meta.fields + ["secret_key"]


class KeyPairPermission(permissions.BasePermission):
    """Users read their own keypairs; admins change anyone's. A user asking to change
    another user's keypair finds none (404), as for any of that user's things."""

    message = "Only administrators may change keypairs."

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or view.detail or \
            request_is_admin(request)

    def has_object_permission(self, request, view, obj):
        return request.method in permissions.SAFE_METHODS or request_is_admin(request)


class KeyPairViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin,
                     mixins.DestroyModelMixin, mixins.ListModelMixin,
                     mixins.RetrieveModelMixin, RestrictedViewSet):
    """Keypairs: yours; admins see, create, change and delete anyone's. The secret key is
    shown once, in the answer to the create."""

    queryset = KeyPair.objects.select_related("user", "resource_policy").order_by(
        "created_at", "access_key")
    permission_classes = [permissions.IsAuthenticated, KeyPairPermission]
    lookup_value_regex = "[A-Za-z0-9]{1,20}"

    def get_serializer_class(self):
        if self.action in ("update", "partial_update"):
            return KeyPairUpdateSerializer
        return KeyPairSerializer

    @extend_schema(responses={201: KeyPairCreatedSerializer})
    def create(self, request, *args, **kwargs):
        body = KeyPairSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields = dict(body.validated_data)
        fields.setdefault("resource_policy", default_of(ResourcePolicy))
        keypair = KeyPair.objects.create(**fields)
        return Response(KeyPairCreatedSerializer(keypair).data, status=201)

    def perform_destroy(self, instance):
        if instance.is_main:
            raise RequestFailed("A user's main keypair cannot be deleted; deactivate it "
                                "instead.", 409)
        instance.delete()


def _names_among(known, what):
    def validate(value):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise serializers.ValidationError(f"A list of {what} names.")
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise serializers.ValidationError(
                f"Unknown {what}: {', '.join(unknown)}; known: {', '.join(sorted(known))}.")
        return value
    return validate


class ScalingGroupSerializer(serializers.ModelSerializer):
    validators = serializers.JSONField(required=False,
                                       validators=[_names_among(CONFIGURABLE, "validator")])
    idle_checkers = serializers.JSONField(required=False,
                                          validators=[_names_among(CHECKERS, "idle checker")])

    class Meta:
        model = ScalingGroup
        exclude = ["roundrobin_cursor"]


class ScalingGroupViewSet(viewsets.ModelViewSet):
    """Scaling groups: their scheduler, agent selection, validators and timeouts (admins
    read, superadmins change)."""

    queryset = ScalingGroup.objects.order_by("name")
    serializer_class = ScalingGroupSerializer
    permission_classes = [AdminReadsSuperadminWrites]


class SlotsField(serializers.JSONField):
    """Resource slots, answered in canonical units (cpu cores, mem bytes) as stored."""

    def to_internal_value(self, data):
        try:
            return ResourceSlots.parse(data).to_json()
        except SlotError as exc:
            raise serializers.ValidationError(str(exc)) from None


class ResourcePolicySerializer(serializers.ModelSerializer):
    total_resource_slots = SlotsField(required=False, help_text="Per keypair; {} is "
                                                                "unlimited.")

    class Meta:
        model = ResourcePolicy
        fields = "__all__"


class ResourcePolicyViewSet(viewsets.ModelViewSet):
    """Resource policies of keypairs (admins read, superadmins change)."""

    queryset = ResourcePolicy.objects.order_by("name")
    serializer_class = ResourcePolicySerializer
    permission_classes = [AdminReadsSuperadminWrites]
