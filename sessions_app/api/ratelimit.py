"""The per-keypair rate limit: `KeyPair.rate_limit` requests in any 15 minutes.

A sliding window in Redis (one sorted set per keypair, scored by time), checked and
appended in one Lua script so that concurrent web processes count together. Refused
requests are not counted. When Redis does not answer, requests pass: the limit protects
the service and must not take it down.
"""

import logging
import time
import uuid

import redis
from django.utils.deprecation import MiddlewareMixin
from rest_framework.throttling import BaseThrottle

from backendai_web import redis_conn
from identity_app.api.permissions import acting_keypair

log = logging.getLogger(__name__)
WINDOW_SECONDS = 15 * 60
KEY_PREFIX = "bai-ratelimit:"

# KEYS[1] the window; ARGV: now, window, limit, member. Returns the count after this
# request, or -(count) when it is refused, plus the oldest entry's time.
_SCRIPT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1] - ARGV[2])
local count = redis.call('ZCARD', KEYS[1])
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or ARGV[1]
if count >= tonumber(ARGV[3]) then
  return {-count, tostring(oldest)}
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return {count + 1, tostring(oldest)}
"""

_client = None
_script = None


def _redis_script():
    global _client, _script
    if _script is None:
        _client = redis_conn.client(socket_timeout=0.5,
                                       socket_connect_timeout=0.5)
        _script = _client.register_script(_SCRIPT)
    return _script


def hit(access_key, limit, now=None):
    """Count one request; (allowed, remaining, seconds until a slot frees) or None when
    Redis did not answer."""
    now = time.time() if now is None else now
    try:
        count, oldest = _redis_script()(
            keys=[KEY_PREFIX + access_key],
            args=[now, WINDOW_SECONDS, limit, f"{now}:{uuid.uuid4().hex[:8]}"])
    except redis.RedisError as exc:
        log.warning("rate limit not checked, Redis did not answer: %s", exc)
        return None
    count = int(count)
    wait = max(float(oldest) + WINDOW_SECONDS - now, 0)
    if count < 0:
        return False, 0, wait
    return True, max(limit - count, 0), wait


class KeypairRateThrottle(BaseThrottle):
    """DRF throttle on the acting keypair; the headers are added by RateLimitHeaders."""

    def allow_request(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return True
        keypair = acting_keypair(request)
        outcome = hit(keypair.access_key, keypair.rate_limit)
        if outcome is None:
            return True
        allowed, remaining, self._wait = outcome
        request._request.rate_limit = (keypair.rate_limit, remaining)
        return allowed

    def wait(self):
        return getattr(self, "_wait", None)


class RateLimitHeaders(MiddlewareMixin):
    """Middleware: X-RateLimit-Limit and X-RateLimit-Remaining on rate-limited responses."""

    def process_response(self, request, response):
        limit = getattr(request, "rate_limit", None)
        if limit is not None:
            response["X-RateLimit-Limit"] = str(limit[0])
            response["X-RateLimit-Remaining"] = str(limit[1])
        return response
