"""The DRF API of scaling groups: their scheduler, agent selection, validators and timeouts
(admins read, superadmins change)."""

from rest_framework import serializers, viewsets

from identity_app.api.permissions import AdminReadsSuperadminWrites
from scheduling_app.idle import CHECKERS
from scheduling_app.models import ScalingGroup
from scheduling_app.scheduler.predicates import CONFIGURABLE


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
