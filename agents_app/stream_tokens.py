"""Tokens for the agent's stream endpoint, and the service ports an image declares.

The web process mints a token after it has checked that the user may open the session's
terminal or app; the agent opens nothing without one. A token names the agent, the kernel
and its container, and what may be opened (`pty:<terminal id>` or `service:<name>`), and
expires after STREAM_TOKEN_TTL seconds. It is signed (django.core.signing, HMAC-SHA256)
with STREAM_TOKEN_SECRET, which the manager and its agents share.
"""

import re
import time
from dataclasses import dataclass

from django.conf import settings
from django.core import signing

SALT = "backendai-web.stream-token"
TOKEN_HEADER = "X-Stream-Token"  # how the web process presents a token to the agent
SERVICE_PORTS_LABEL = "ai.backend.service-ports"
SERVICE_START_LABEL = "ai.backend.service-start."  # + name: the command that starts it
PROTOCOLS = ("http", "tcp", "preopen")
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
TERMINAL_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class InvalidToken(Exception):
    pass


def mint(*, agent_id, kernel_id, container_id, target, ttl=None, now=None):
    now = time.time() if now is None else now
    payload = {"a": agent_id, "k": str(kernel_id), "c": container_id, "t": target,
               "e": round(now + (settings.STREAM_TOKEN_TTL if ttl is None else ttl), 3)}
    return signing.dumps(payload, key=settings.STREAM_TOKEN_SECRET, salt=SALT)


def verify(token, *, agent_id=None, target=None, now=None):
    """The token's payload, or InvalidToken: forged or altered, expired, for another
    agent, or for something else than `target`."""
    try:
        payload = signing.loads(token or "", key=settings.STREAM_TOKEN_SECRET, salt=SALT)
    except signing.BadSignature:
        raise InvalidToken("bad signature") from None
    if not isinstance(payload, dict) or not {"a", "k", "c", "t", "e"} <= payload.keys():
        raise InvalidToken("malformed")
    if (time.time() if now is None else now) > payload["e"]:
        raise InvalidToken("expired")
    if agent_id is not None and payload["a"] != agent_id:
        raise InvalidToken("for another agent")
    if target is not None and payload["t"] != target:
        raise InvalidToken("for something else")
    return payload


@dataclass(frozen=True)
class ServicePort:
    name: str
    protocol: str
    port: int

    def as_backendai(self):
        """The shape of the Backend.AI SDK's servicePorts entries."""
        return {"name": self.name, "protocol": self.protocol, "container_ports": [self.port],
                "host_ports": [None], "is_inference": False}


def service_ports(labels):
    """The services `ai.backend.service-ports` declares ("name:protocol:port,…"); entries
    that are not well formed are left out."""
    found = {}
    for entry in ((labels or {}).get(SERVICE_PORTS_LABEL) or "").split(","):
        parts = entry.strip().split(":")
        if len(parts) != 3:
            continue
        name, protocol, port = parts
        if NAME.match(name) and protocol in PROTOCOLS and port.isdigit() \
                and 0 < int(port) < 65536 and name not in found:
            found[name] = ServicePort(name, protocol, int(port))
    return list(found.values())


def service_port(labels, name):
    return next((s for s in service_ports(labels) if s.name == name), None)
