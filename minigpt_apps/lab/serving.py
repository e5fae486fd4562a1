"""What `minigpt-jax lab` checks and bounds around Gradio's server: the port, before Gradio tries
it (one line naming the port and the cause), and the log, whose lines a malformed request could
otherwise fill with its whole payload (Gradio prints the inputs it received in its tracebacks)."""

from __future__ import annotations

import errno
import io
import logging
import socket

MAX_LINE_CHARS = 2000  # one write or log record to stderr, at most


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
