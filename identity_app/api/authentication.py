"""Keypair signatures, as the Backend.AI client SDK signs its requests."""

import hashlib
import hmac
from datetime import UTC, datetime, timedelta

from django.utils.dateparse import parse_datetime
from django.utils.http import parse_http_date_safe
from rest_framework import authentication, exceptions

from common import clock
from identity_app import audit
from identity_app.encryption import UnreadableSecret
from identity_app.models import KeyPair

MAX_CLOCK_SKEW = timedelta(minutes=15)
HASH_TYPES = {"sha256", "sha384", "sha512", "sha224", "sha1", "md5"}


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
    try:
        parsed = parse_datetime(text or "")
    except ValueError:  # well formed but not a date, such as month 13
        parsed = None
    if parsed is None:
        seconds = parse_http_date_safe(text or "")
        if seconds is None:
            raise exceptions.AuthenticationFailed("The Date header is missing or not a date.")
        parsed = datetime.fromtimestamp(seconds, tz=UTC)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _too_far_from_now(date):
    try:
        return abs(clock.now() - date) > MAX_CLOCK_SKEW
    except OverflowError:  # year 1 or 9999 with an offset
        return True


def signed_paths(request):
    """The path with query the client signed: as it was sent (under ASGI), and as Django
    spells it, which differ only in how characters are escaped."""
    paths = [request.get_full_path()]
    scope = getattr(request._request, "scope", None) or {}
    raw = scope.get("raw_path")
    if raw:
        query = scope.get("query_string") or b""
        sent = raw.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
        if sent != paths[0]:
            paths.insert(0, sent)
    return paths


class KeypairSignatureAuthentication(authentication.BaseAuthentication):
    keyword = "BackendAI"

    def authenticate(self, request):
        try:
            return self._authenticate(request)
        except exceptions.AuthenticationFailed as exc:
            access_key = request.META.get("HTTP_AUTHORIZATION", "").partition(
                "credential=")[2].partition(":")[0]
            owner = KeyPair.objects.filter(access_key=access_key[:20]).select_related(
                "user").first() if access_key else None
            audit.record("login.keypair", result=audit.REFUSED, access_key=access_key,
                         username=owner.user.get_username() if owner else "-",
                         request=request, message=str(exc.detail))
            raise

    def _authenticate(self, request):
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
        if hash_type not in HASH_TYPES:
            raise exceptions.AuthenticationFailed(f"Unsupported signMethod {method}.")
        version = request.META.get("HTTP_X_BACKENDAI_VERSION")
        if not version:
            raise exceptions.AuthenticationFailed("The X-BackendAI-Version header is required.")
        date = request.META.get("HTTP_X_BACKENDAI_DATE") or request.META.get("HTTP_DATE", "")
        if _too_far_from_now(_parse_date(date)):
            raise exceptions.AuthenticationFailed(
                "The request date is more than 15 minutes away from the server's time.")
        keypair = KeyPair.objects.select_related("user", "resource_policy").filter(
            access_key=access_key).first()
        if keypair is None:
            raise exceptions.AuthenticationFailed("Unknown access key.")
        if not keypair.is_active or not keypair.user.is_active:
            raise exceptions.AuthenticationFailed("This keypair is inactive.")
        if isinstance(keypair.secret_key, UnreadableSecret):
            raise exceptions.AuthenticationFailed(
                "The server cannot read this keypair's secret key; ask an operator "
                "(SECRET_KEY_ENCRYPTION_KEYS).")
        # Without the header, the content type is application/octet-stream (RFC 9110, and
        # aiohttp's default, which the Backend.AI manager signs with): the SDK's event
        # streams sign that and send no Content-Type.
        # The manager signs the media type without its parameters (aiohttp's
        # content_type): a multipart upload is signed as "multipart/form-data", sent with
        # its boundary.
        content_type = request.content_type or "application/octet-stream"
        content_types = dict.fromkeys([content_type, content_type.split(";")[0].strip()])
        signed = [sign(keypair.secret_key, method=request.method, path=path, date=date,
                       host=request.get_host(), content_type=media_type,
                       version=version, hash_type=hash_type)
                  for path in signed_paths(request) for media_type in content_types]
        given = signature.encode("utf-8", "replace")
        if not any(hmac.compare_digest(expected.encode(), given) for expected in signed):
            raise exceptions.AuthenticationFailed("The signature does not match the request.")
        KeyPair.objects.filter(pk=keypair.pk).update(last_used=clock.now())
        return keypair.user, keypair

    def authenticate_header(self, request):
        return self.keyword
