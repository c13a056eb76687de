"""The kinds of a stage's failure (agents_app.runtime.errors), from Docker's exceptions
and from the words of older reports."""

import pytest
from docker.errors import APIError, ImageNotFound, NotFound

from agents_app.runtime import errors


class _Response:
    def __init__(self, status_code):
        self.status_code = status_code
        self.reason = ""


def api_error(message, status=500, cls=APIError):
    return cls(message, response=_Response(status), explanation=message)


@pytest.mark.parametrize("error, kind", [
    (api_error("manifest for r/x:1 not found: manifest unknown", 404), errors.PERMANENT),
    (api_error("pull access denied for nosuch, repository does not exist", 404),
     errors.PERMANENT),
    (api_error('exec: "nosuchcmd": executable file not found in $PATH', 400),
     errors.PERMANENT),
    (api_error("invalid reference format", 400), errors.PERMANENT),
    (api_error("No such image: bai-local/busybox:latest", 404, ImageNotFound),
     errors.TRANSIENT),
    (api_error("network bai-session-1 not found", 404, NotFound), errors.TRANSIENT),
    (api_error("invalid mount config for type \"bind\": bind source path does not exist",
               400), errors.AGENT),
    (errors.AgentCannotRun("storage folder 'data' is not on this host"), errors.AGENT),
    (errors.KernelCannotRun("exec nosuchcmd failed: No such file or directory"),
     errors.PERMANENT),
    (api_error('Get "http://localhost:5000/v2/": dial tcp connect: connection refused'),
     errors.TRANSIENT),
    (api_error("Minimum memory limit allowed is 6MB", 400), errors.PERMANENT),
    ("image pull timed out after 600s", errors.TRANSIENT),
    ("failed-to-start: manifest unknown", errors.PERMANENT),
])
def test_each_failure_has_the_kind_that_says_what_a_retry_can_do(error, kind):
    assert errors.kind_of(error) == kind
