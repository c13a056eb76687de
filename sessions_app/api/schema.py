"""OpenAPI schema details: every operation documents the error answers it can give, in
Backend.AI's error form, and the keypair signature as a security scheme."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema as BaseAutoSchema
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="A Backend.AI problem URL.")
    title = serializers.CharField()
    msg = serializers.CharField(help_text="What exactly went wrong.")
    data = serializers.JSONField(required=False, help_text="Per-field errors, when any.")


# Any request may be refused for its credentials, its rate or its parameters; detail
# routes may name something that is not there (or not yours); session operations may
# conflict with the session's state or find its agent away.
COMMON_ERRORS = ("400", "401", "403", "429")
DETAIL_ERRORS = ("404", "409", "503")


class AutoSchema(BaseAutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        codes = COMMON_ERRORS + (DETAIL_ERRORS if getattr(self.view, "detail", False) or
                                 self.method in ("POST", "PUT", "PATCH") else ())
        for code in codes:
            if code not in responses:
                responses[code] = self._get_response_for_code(ErrorSerializer, code,
                                                              direction=direction)
        return responses


class KeypairSignatureScheme(OpenApiAuthenticationExtension):
    target_class = "identity_app.api.authentication.KeypairSignatureAuthentication"
    name = "keypairSignature"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`BackendAI signMethod=HMAC-SHA256, credential=ACCESS_KEY:"
                               "SIGNATURE`, with `Date` (or `X-BackendAI-Date`) and "
                               "`X-BackendAI-Version` headers; see docs/api.md."}
