"""Tokens for the storage proxy, as Backend.AI's manager hands them out with a storage
proxy's URL (`request-upload`, `request-download`): the client presents one with each
request to the proxy, which has no other credential to check.

A token names one operation (upload or download), one folder, one path in it, the user
it was given to (their right to the folder is checked again at every request, so a grant
taken back stops a transfer) and, for an upload, the upload it continues; it expires
STORAGE_TOKEN_TTL seconds after it was made. It is signed with the SECRET_KEY
(django.core.signing, HMAC-SHA256): the web processes make and check them, nothing else.
"""

import time

from django.conf import settings
from django.core import signing

SALT = "backendai-web.storage-proxy-token"
UPLOAD, DOWNLOAD = "upload", "download"
ARTICLED = {UPLOAD: "an upload", DOWNLOAD: "a download"}


class InvalidToken(Exception):
    """The token cannot be used here; `message` says why, `status_code` how."""

    def __init__(self, message, status_code=403):
        super().__init__(message)
        self.message, self.status_code = message, status_code


def mint(op, *, folder, path, user, admin=False, upload=None, ttl=None, now=None):
    """A token for `op` on `path` of `folder` by `user` (`admin`: acting as an
    administrator, as the request that asked for it was)."""
    now = time.time() if now is None else now
    payload = {"o": op, "f": folder.pk.hex, "p": path, "u": user.pk,
               "e": round(now + (settings.STORAGE_TOKEN_TTL if ttl is None else ttl), 3)}
    if admin:
        payload["a"] = 1
    if upload is not None:
        payload["up"] = upload.pk.hex
    return signing.dumps(payload, salt=SALT)


def verify(token, op, *, folder_id, path, now=None):
    """The payload of a token good for `op` on `path` of the folder `folder_id` (hex), or
    InvalidToken: missing, forged or altered, expired, or made for something else."""
    if not token:
        raise InvalidToken("This request needs the token that request-upload or "
                           "request-download handed out, as ?token=.", 401)
    try:
        payload = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        raise InvalidToken("The token is not one this server made (or it was altered).",
                           401) from None
    if not isinstance(payload, dict) or not {"o", "f", "p", "u", "e"} <= payload.keys():
        raise InvalidToken("The token is malformed.", 401)
    if (time.time() if now is None else now) > payload["e"]:
        raise InvalidToken("The token has expired; ask for a new one.", 401)
    if payload["o"] != op:
        raise InvalidToken(f"The token is for {ARTICLED[payload['o']]}, not {ARTICLED[op]}.")
    if payload["f"] != folder_id:
        raise InvalidToken("The token is for another folder.")
    if payload["p"] != path:
        raise InvalidToken("The token is for another path.")
    return payload
