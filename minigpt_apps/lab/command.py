"""`minigpt-jax lab [--port N] [--open] [--lang en|es]`: the course's embedding lab served on
127.0.0.1 until Ctrl-C (needs the `lab` extra). Exit status 0 when stopped by Ctrl-C, 143 by
SIGTERM (the server closed and its temp folder removed either way), 1 for a port it cannot use
or a missing extra (one line on stderr), 128 + the signal's number for a signal that came while
it started."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from minigpt_jax.runtime.signals import record_signals_while_starting, stop_recording

PROG = "minigpt-jax lab"
HELP = "the course's embedding lab as a local web page"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=HELP)
    parser.add_argument("--port", type=int, help="port on 127.0.0.1; default: a free one")
    parser.add_argument("--open", action="store_true", help="open the page in the default browser")
    parser.add_argument("--lang", choices=("en", "es"), default="en", help="the page's language")
    return parser


def main(argv: list[str]) -> int:
    """Serves the lab; returns the exit status (an error is one line on stderr)."""
    record_signals_while_starting()  # a signal before the page serves ends it in one line
    args = _parser().parse_args(argv)
    from minigpt_apps.lab.serving import bound_the_log, check_port

    try:
        check_port(args.port)  # before Gradio's 10 s of retries and its traceback
        try:
            from minigpt_apps.lab.app import launch
        except ImportError as error:
            raise RuntimeError(
                f"the lab needs the `lab` extra ({error}); install it with pip install -e '.[lab]'."
            ) from None
    except (OSError, ValueError, RuntimeError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    early = stop_recording()  # Python's own handling back: Gradio's server stops on Ctrl-C
    if early is not None:
        print(f"{PROG}: stopped by {early.name} as it started; nothing was done.", file=sys.stderr)
        sys.stderr.flush()
        os._exit(128 + int(early))
    bound_the_log()  # a malformed request's payload would fill it
    signal.signal(signal.SIGTERM, _terminated)  # the server closes and its files go, as on Ctrl-C
    try:
        launch(port=args.port, open_browser=args.open, lang=args.lang)
    except KeyboardInterrupt:
        pass
    return 0


def _terminated(signum, frame) -> None:
    del frame
    raise SystemExit(128 + signum)
