"""What the stream endpoint's pieces share: the refusal every route answers, a request's
JSON object, and the threads of long transfers. Below the server (streams.py) and its
route modules (session_streams.py, kept_streams.py): the server adds their routes, and no
route module imports the server."""

import json
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

# A command's output reader, an upload's writer and a kept kernel's stream each hold a
# thread for as long as they last: a pool of their own, so that they never starve
# asyncio's default one (Docker calls).
LONG_THREADS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="session-streams")


class Refused(web.HTTPException):
    """A refusal as JSON `{"error": message}` with its status."""

    def __init__(self, status, message):
        self.status_code = status
        super().__init__(text=json.dumps({"error": message}), content_type="application/json")


def json_object(text):
    """The JSON object `text` holds; {} for anything else (not JSON, not an object)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
