"""The HTTP/1.1 protocol `seqrec serve` runs uvicorn with: uvicorn's own (httptools), except that a request
it cannot parse (a bad request line, header or Content-Length) is answered as every other error of the
service is, a JSON object whose `error` names the problem, not uvicorn's plain-text "Invalid HTTP request
received." Such a request never reaches the app, so its middleware cannot do this. (A class at module level:
the workers of `--workers N` are spawned processes that import it by name.)"""

from __future__ import annotations

import json
from typing import Any

MALFORMED = ("malformed HTTP/1.1 request: the request line, a header or the body's length (Content-Length, "
             "chunked encoding) cannot be parsed")

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    HTTPTOOLS = True
except ImportError:  # no httptools (uvicorn without [standard]): uvicorn's plain-text answers stay
    HTTPTOOLS = False


if HTTPTOOLS:
    class JsonErrorProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol answering an unparsable request with a JSON error."""

        def send_400_response(self, msg: str) -> None:  # msg: the plain text uvicorn would send
            body = json.dumps({"error": MALFORMED}).encode()
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                     b"connection: close\r\n\r\n"]
            self.transport.write(b"".join(head) + body)
            self.transport.close()


def uvicorn_options() -> dict[str, Any]:
    """The keyword arguments of `uvicorn.run` that every `seqrec serve` process takes."""
    options: dict[str, Any] = {"access_log": False, "log_level": "warning"}
    if HTTPTOOLS:
        options["http"] = JsonErrorProtocol
    return options
