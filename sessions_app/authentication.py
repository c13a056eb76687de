"""Keypair signatures, as the Backend.AI client SDK signs its requests."""

import hashlib
import hmac
from datetime import UTC, datetime, timedelta

from django.utils.dateparse import parse_datetime
from django.utils.http import parse_http_date_safe
from rest_framework import authentication, exceptions

from . import clock
from .models import KeyPair

MAX_CLOCK_SKEW = timedelta(minutes=15)


def sign(secret_key, *, method, path, date, host, content_type, version, hash_type="sha256"):
    """The hex signature of a request; `date` is the header text as sent."""
    body_hash = hashlib.new(hash_type, b"").hexdigest()
    text = (f"{method.upper()}\n{path}\n{date}\nhost:{host}\n"
            f"content-type:{content_type.lower()}\nx-backendai-version:{version}\n{body_hash}")
    day = _parse_date(date).strftime("%Y%m%d")
    key = hmac.new(secret_key.encode(), day.encode(), hash_type).digest()
    key = hmac.new(key, host.encode(), hash_type).digest()
    return hmac.new(key, text.encode(), hash_type).hexdigest()


def _parse_date(text):
    parsed = parse_datetime(text or "")
    if parsed is None:
        seconds = parse_http_date_safe(text or "")
        if seconds is None:
            raise exceptions.AuthenticationFailed("The Date header is missing or not a date.")
        parsed = datetime.fromtimestamp(seconds, tz=UTC)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


class KeypairSignatureAuthentication(authentication.BaseAuthentication):
    keyword = "BackendAI"

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header.startswith(self.keyword + " "):
            return None
        params = dict(
            part.strip().split("=", 1) for part in header[len(self.keyword) + 1:].split(",")
            if "=" in part
        )
        method = params.get("signMethod", "")
        access_key, _, signature = params.get("credential", "").partition(":")
        if not method.upper().startswith("HMAC-") or not signature:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        hash_type = method.split("-", 1)[1].lower()
        if hash_type not in hashlib.algorithms_guaranteed:
            raise exceptions.AuthenticationFailed(f"Unsupported signMethod {method}.")
        version = request.META.get("HTTP_X_BACKENDAI_VERSION")
        if not version:
            raise exceptions.AuthenticationFailed("The X-BackendAI-Version header is required.")
        date = request.META.get("HTTP_X_BACKENDAI_DATE") or request.META.get("HTTP_DATE", "")
        if abs(clock.now() - _parse_date(date)) > MAX_CLOCK_SKEW:
            raise exceptions.AuthenticationFailed(
                "The request date is more than 15 minutes away from the server's time.")
        keypair = KeyPair.objects.select_related("user", "resource_policy").filter(
            access_key=access_key).first()
        if keypair is None:
            raise exceptions.AuthenticationFailed("Unknown access key.")
        if not keypair.is_active or not keypair.user.is_active:
            raise exceptions.AuthenticationFailed("This keypair is inactive.")
        expected = sign(keypair.secret_key, method=request.method,
                        path=request.get_full_path(), date=date, host=request.get_host(),
                        content_type=request.content_type or "", version=version,
                        hash_type=hash_type)
        if not hmac.compare_digest(expected, signature):
            raise exceptions.AuthenticationFailed("The signature does not match the request.")
        KeyPair.objects.filter(pk=keypair.pk).update(last_used=clock.now())
        return keypair.user, keypair

    def authenticate_header(self, request):
        return self.keyword
