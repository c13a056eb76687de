"""Exceptions to answers in Backend.AI's error form: DRF's exception handler and a middleware
for every other route (a database away is a JSON 503 everywhere)."""

import logging
import re

from asgiref.sync import iscoroutinefunction
from django.db import DataError, IntegrityError, InterfaceError, OperationalError
from django.db.models import ProtectedError, RestrictedError
from django.http import JsonResponse
from django.utils.decorators import sync_and_async_middleware
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from sessions_app.api.errors import RequestFailed, error_body
from sessions_app.spec import DomainError

log = logging.getLogger(__name__)


def _flatten(detail):
    if isinstance(detail, dict):
        return "; ".join(f"{key}: {_flatten(value)}" for key, value in detail.items())
    if isinstance(detail, list):
        return " ".join(_flatten(item) for item in detail)
    return str(detail)


DATABASE_RETRY_AFTER = 5  # seconds; a restarting PostgreSQL is usually back by then


def database_unavailable(exc):
    """503 with a retry hint for a request that found the database away (restarting,
    unreachable); nothing was half-written: each request is one transaction or none."""
    log.warning("database unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
    return JsonResponse(
        error_body(503, "The database is not answering; nothing was changed. Try again in "
                        f"{DATABASE_RETRY_AFTER} seconds.", title="Database unavailable."),
        status=503, headers={"Retry-After": str(DATABASE_RETRY_AFTER)})


class DatabaseUnavailableMiddleware:
    """Every page and route (not only the DRF API): a lost database connection is a JSON 503,
    never Django's error page or a traceback, also under DEBUG."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, OperationalError | InterfaceError):
            return database_unavailable(exception)
        return None


def exception_handler(exc, context):
    if isinstance(exc, DomainError):  # refusals of the domain, in the API's form
        exc = RequestFailed.refusing(exc)
    if isinstance(exc, OperationalError | InterfaceError):
        return database_unavailable(exc)
    if isinstance(exc, DataError):  # such as a NUL character, which PostgreSQL cannot store
        return Response(error_body(400, "The request holds a value the database cannot store "
                                        "(a NUL character, or a number out of range)."),
                        status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ProtectedError | RestrictedError):
        names = sorted({str(obj) for obj in list(exc.args[1])[:5]})
        return Response(error_body(409, "It is still in use by: " + ", ".join(names) + "."),
                        status=status.HTTP_409_CONFLICT)
    # After ProtectedError, a subclass: a race that validation could not see.
    if isinstance(exc, IntegrityError):
        log.info("integrity error in %s: %s", context.get("view"), exc)
        return Response(error_body(409, "The change conflicts with existing data; reload and "
                                        "try again."), status=status.HTTP_409_CONFLICT)
    response = drf_exception_handler(exc, context)
    if response is None:
        log.exception("unhandled error in %s", context.get("view"))
        return Response(error_body(500, "Internal server error; the operators have the details."),
                        status=500)
    detail = response.data
    if isinstance(exc, RequestFailed):
        response.data = error_body(response.status_code, str(exc.detail), problem=exc.problem,
                                   data=exc.data, title=exc.title)
    elif isinstance(detail, dict) and set(detail) == {"detail"}:
        response.data = error_body(response.status_code, str(detail["detail"]))
    else:  # field errors of a serializer
        response.data = error_body(response.status_code, _flatten(detail), data=detail)
    return response



# Paths only programs call: their errors are JSON even for a browser (/sessions/ is the
# dashboard's, /session the clients').
CLIENT_ONLY_PATHS = re.compile(r"^/(?:api|session|events|template|stream|admin/gql)(?:/|$)")


def wants_html_page(request):
    """A browser asking for a dashboard page: its errors may stay Django's HTML pages."""
    return not CLIENT_ONLY_PATHS.match(request.path) and \
        request.get_preferred_type(["application/json", "text/html"]) == "text/html"


ERROR_MESSAGES = {
    404: "There is no {path}.",
    405: "{method} is not allowed on {path}.",
    500: "Internal server error; the operators have the details.",
}
KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate")


def as_json_error(request, response):
    """An error answered with an HTML page (Django's 404/500 pages, its debug pages, an
    empty 405, a CSRF refusal) as Backend.AI's JSON error body instead; other answers as
    they are."""
    if response.status_code < 400 or response.streaming or wants_html_page(request):
        return response
    content_type = response.get("Content-Type", "")
    if content_type.startswith("application/json") or (
            response.content and not content_type.startswith("text/html")):
        return response
    message = ERROR_MESSAGES.get(response.status_code, "The request failed ({status}).")
    answer = JsonResponse(error_body(response.status_code, message.format(
        path=request.path, method=request.method, status=response.status_code)),
        status=response.status_code)
    for header in KEPT_HEADERS:
        if header in response:
            answer[header] = response[header]
    return answer


@sync_and_async_middleware
def json_errors_middleware(get_response):
    """Every path a client may call answers errors in JSON (404, 405, 500 and the rest),
    also under DEBUG; browsers asking for dashboard pages keep the HTML pages."""
    if iscoroutinefunction(get_response):
        async def middleware(request):
            return as_json_error(request, await get_response(request))
    else:
        def middleware(request):
            return as_json_error(request, get_response(request))
    return middleware
