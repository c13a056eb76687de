"""Errors in Backend.AI's JSON form, `{"type", "title", "msg"}`, for every API response.

The Backend.AI CLI prints `title`, then `msg`, then (for invalid parameters) each entry of
`data`; so the title names the kind of failure and the message says what exactly.
How exceptions become these answers: handlers.py (it imports DRF's views, which load the
throttle classes, so nothing those import may import it).
"""

from rest_framework.exceptions import APIException

PROBLEM_BASE = "https://api.backend.ai/probs/"

# Status → (Backend.AI problem type, title).
PROBLEMS = {
    400: ("invalid-api-params", "Missing or invalid API parameters."),
    401: ("auth-failed", "Credential/signature mismatch."),
    403: ("generic-forbidden", "Forbidden operation."),
    404: ("object-not-found", "No such object."),
    405: ("method-not-allowed", "Unsupported HTTP method."),
    406: ("not-acceptable", "Not acceptable."),
    409: ("invalid-session-state", "The request conflicts with the current state."),
    415: ("unsupported-media-type", "Unsupported media type."),
    429: ("too-many-requests", "Too many requests."),
    500: ("internal-server-error", "Something has gone wrong."),
    501: ("not-implemented", "This API is not implemented."),
    503: ("service-unavailable", "Service unavailable."),
}


def error_body(status_code, message, title=None, problem=None, data=None):
    default_problem, default_title = PROBLEMS.get(
        status_code, (f"{status_code}", "The request failed."))
    body = {"type": PROBLEM_BASE + (problem or default_problem),
            "title": title or default_title, "msg": message}
    if data is not None:
        body["data"] = data
    return body


class RequestFailed(APIException):
    """An error with its status, message and optionally a Backend.AI problem type and data."""

    def __init__(self, message, status_code=400, problem=None, data=None, title=None):
        self.status_code = status_code
        self.problem, self.data, self.title = problem, data, title
        super().__init__(message)

    @classmethod
    def refusing(cls, error):
        """The answer to a domain error (sessions_app.spec.DomainError): its status, its
        message, and the field it names as Backend.AI's invalid-parameter data."""
        data = {field: [message] for field, message in error.errors.items()}
        return cls(error.message, error.status_code, data=data or None,
                   problem=error.problem, title=error.title)
