"""What `minigpt-jax lab` checks and bounds around Gradio's server: the port, before Gradio tries
it (one line naming the port and the cause); the log, whose lines a malformed request could
otherwise fill with its whole payload (Gradio prints the inputs it received in its tracebacks);
and the requests it refuses (`Gatekeeper`: files, and changes asked by another site's page)."""

from __future__ import annotations

import errno
import io
import logging
import os
import shutil
import socket
import tempfile

MAX_LINE_CHARS = 2000  # one write or log record to stderr, at most

# Gradio's routes that store a file sent to them (under the temp folder, served back by
# /gradio_api/file=): the lab has no file input, so none of them is any use to it.
FILE_ROUTES = ("/gradio_api/upload", "/gradio_api/process_recording")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# Gradio's files go to a folder of this process's own (it stores nothing there while the lab
# refuses files), which the lab removes when it stops, where they went to the temp folder's
# gradio/, shared with every other Gradio app, and stayed.
TEMP_DIR = os.path.join(tempfile.gettempdir(), f"minigpt-jax-lab-{os.getpid()}")


def use_own_temp_dir() -> None:
    """Points Gradio at TEMP_DIR unless GRADIO_TEMP_DIR is set (before gradio is imported:
    some of its modules read it then)."""
    os.environ.setdefault("GRADIO_TEMP_DIR", TEMP_DIR)


def remove_temp_dir() -> None:
    """Removes the folder of Gradio's files that the lab made for this process (none other)."""
    if os.environ.get("GRADIO_TEMP_DIR") == TEMP_DIR:
        shutil.rmtree(TEMP_DIR, ignore_errors=True)


def check_port(port: int | None, host: str = "127.0.0.1") -> None:
    """Refuses a --port that is no port, is taken, or needs a right this process lacks (bound
    once and released at once; None or 0, a free port of the lab's choosing, passes)."""
    if not port:
        return
    if not 1 <= port <= 65535:
        raise ValueError(
            f"--port {port} is not a TCP port: give one from 1 to 65535, or leave --port out "
            "for a free one."
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                cause = "is in use by another program (another lab?)"
            elif error.errno == errno.EACCES:
                cause = "needs a right this user lacks (ports below 1024 need root)"
            else:
                cause = f"cannot be opened ({error.strerror})"
            raise ValueError(
                f"port {port} on {host} {cause}: give another --port, or leave --port out for "
                "a free one."
            ) from None


def _cut(text: str, limit: int = MAX_LINE_CHARS) -> str:
    if len(text) <= limit:
        return text
    ending = "\n" if text.endswith("\n") else ""
    return f"{text[:limit]} ... [{len(text) - limit:,} characters cut]{ending}"


class BoundedStream(io.TextIOBase):
    """A text stream that passes each write on to `stream`, cut to `limit` characters per line."""

    def __init__(self, stream, limit: int = MAX_LINE_CHARS):
        self.stream, self.limit = stream, limit

    def write(self, text: str) -> int:
        lines = text.split("\n")
        self.stream.write("\n".join(_cut(line, self.limit) for line in lines))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()


class BoundedRecords(logging.Filter):
    """Cuts a log record's message (its arguments included) to `limit` characters."""

    def __init__(self, limit: int = MAX_LINE_CHARS):
        super().__init__()
        self.limit = limit

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > self.limit:
            record.msg, record.args = _cut(message, self.limit), None
        return True


def bound_the_log(limit: int = MAX_LINE_CHARS) -> None:
    """From here on, stderr's writes and the records of the server's loggers are cut to `limit`
    characters a line."""
    import sys

    if not isinstance(sys.stderr, BoundedStream):
        sys.stderr = BoundedStream(sys.stderr, limit)
    records = BoundedRecords(limit)
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "gradio", "fastapi"):
        logger = logging.getLogger(name)
        logger.addFilter(records)
        for handler in logger.handlers:
            handler.addFilter(records)


def lab_origins(port: int) -> frozenset[str]:
    """The origins of the lab's own page: the two names of 127.0.0.1 on its port."""
    return frozenset({f"http://127.0.0.1:{port}", f"http://localhost:{port}"})


class Gatekeeper:
    """ASGI middleware in front of Gradio's routes: a request to store a file is refused (403),
    whatever its origin, before its body is read; and so is any request other than GET, HEAD or
    OPTIONS whose Origin is not the lab's own page (a page of another site in the learner's
    browser, or a DNS-rebound name, could otherwise drive the lab)."""

    def __init__(self, app, origins: frozenset[str]):
        self.app, self.origins = app, origins

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope["path"].rstrip("/")
            origin = dict(scope["headers"]).get(b"origin", b"").decode("latin-1")
            if path.endswith(FILE_ROUTES):
                return await _refuse(send, "the lab takes no files: it has no file input.")
            if scope["method"] not in SAFE_METHODS and origin and origin not in self.origins:
                return await _refuse(send, f"the lab answers only its own page, not {origin}.")
        return await self.app(scope, receive, send)


async def _refuse(send, text: str) -> None:
    body = (text[:MAX_LINE_CHARS] + "\n").encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})
