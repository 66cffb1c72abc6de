"""Entry points of the `ivy-serve` and `tulip-serve` commands (crates/native/src/serve.rs)."""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
from collections.abc import Callable

from tulip._native import serve_ivy, serve_tulip


class _JsonLines(logging.Formatter):
    """A record as one JSON object, with the keys of the Rust side's `--json-output` lines."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {"message": record.getMessage()}
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        time = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
        return json.dumps({"timestamp": time, "level": record.levelname, "fields": fields, "target": record.name})


def configure_logging(json_output: bool) -> None:
    """Python's log lines, as text or (`--json-output`) JSON lines; serve.rs calls it once the
    flags are parsed."""
    handler = logging.StreamHandler()
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(_JsonLines() if json_output else logging.Formatter(fmt))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def _run(serve: Callable[[list[str]], int], name: str) -> None:
    """Runs `serve` with this process's flags; exits with its code. Its flags are documented by --help."""
    # `kill -USR1 <pid>` prints every Python thread's stack: the engine's, the waiter's.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    code = serve([name, *sys.argv[1:]])
    # The engine's threads still hold torch's thread pools: finalizing the interpreter under them
    # runs C++ destructors that abort ("terminate called without an active exception"), so a
    # clean stop would read as a crash. Nothing is left to clean up once serve() has returned.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    """`ivy-serve`: Ivy, Tulip and ROSE in one process."""
    _run(serve_ivy, "ivy-serve")


def tulip_main() -> None:
    """`tulip-serve`: Tulip and ROSE alone, for Ivy gateways elsewhere (`--tulip-endpoint`)."""
    _run(serve_tulip, "tulip-serve")


if __name__ == "__main__":
    # `python -m tulip.serve FLAGS` is `tulip-serve FLAGS`: how ivy-serve starts its workers.
    tulip_main()
