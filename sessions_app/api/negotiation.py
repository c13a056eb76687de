"""Content negotiation of the API: JSON when the client asks for nothing it can have.

A browser that opens an API URL (Accept: text/html) and an event-stream client (Accept:
text/event-stream) get JSON rather than a 406, so that errors stay in the Backend.AI form
and the event stream can answer its own content type once the request is accepted. Views
with several renderers (the OpenAPI schema: YAML or JSON) still negotiate.
"""

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation


class JSONUnlessAsked(DefaultContentNegotiation):
    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except NotAcceptable:
            return renderers[0], renderers[0].media_type
