"""Requests signed the way the Backend.AI client SDK signs them, for tests."""

import json as jsonlib
from datetime import UTC, datetime

import requests

from identity_app.api.authentication import sign

API_VERSION = "v7.20230615"


def signed_headers(access_key, secret_key, method, path, host, *, date=None,
                   content_type="application/json", version=API_VERSION):
    date = date or datetime.now(UTC).isoformat()
    signature = sign(secret_key, method=method, path=path, date=date, host=host,
                     content_type=content_type, version=version)
    return {
        "Date": date,
        "Content-Type": content_type,
        "X-BackendAI-Version": version,
        "Authorization": f"BackendAI signMethod=HMAC-SHA256, credential={access_key}:{signature}",
    }


class SignedClient:
    """A tiny HTTP client for a running server, authenticated with a keypair."""

    def __init__(self, base_url, access_key, secret_key):
        self.base_url = base_url.rstrip("/")
        self.host = self.base_url.split("://", 1)[1]
        self.access_key, self.secret_key = access_key, secret_key

    def request(self, method, path, json=None):
        headers = signed_headers(self.access_key, self.secret_key, method, path, self.host)
        body = jsonlib.dumps(json) if json is not None else None
        return requests.request(method, self.base_url + path, data=body, headers=headers,
                                timeout=30)


def signed_call(client, keypair, method, path, body=None, *, content_type="application/json",
                sign_path=None, date=None, secret=None, access=None, host="testserver"):
    """A request through Django's test client, signed as the Backend.AI SDK signs it; the
    keyword arguments after `body` tamper with what is signed."""
    headers = signed_headers(access or keypair.access_key, secret or keypair.secret_key,
                             method, sign_path or path, host, date=date,
                             content_type=content_type)
    headers.pop("Content-Type")
    data = jsonlib.dumps(body) if body is not None else ""
    return client.generic(method, path, data=data, content_type=content_type, headers=headers,
                          CONTENT_TYPE=content_type)  # sent (and signed) without a body too
