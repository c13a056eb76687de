"""The DRF API of keypairs (users read their own; admins see, create, change and delete
anyone's) and resource policies (admins read, superadmins change)."""

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.response import Response

from common.slots import ResourceSlots, SlotError
from identity_app.api.permissions import AdminReadsSuperadminWrites, request_is_admin
from identity_app.api.viewsets import RestrictedViewSet
from identity_app.models import KeyPair, ResourcePolicy
from scheduling_app.models import default_of
from sessions_app.api.errors import RequestFailed


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
