"""Entry points of the `ivy-serve` and `tulip-serve` commands."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys

from tulip._native import serve


def main() -> None:
    """Runs the command this process was started as; its flags are documented by --help."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # `kill -USR1 <pid>` prints every Python thread's stack: the engine's, the waiter's.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    name = os.path.basename(sys.argv[0]) or "ivy-serve"
    code = serve([name, *sys.argv[1:]])
    # The engine's threads still hold torch's thread pools: finalizing the interpreter under them
    # runs C++ destructors that abort ("terminate called without an active exception"), so a
    # clean stop would read as a crash. Nothing is left to clean up once serve() has returned.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def tulip_main() -> None:
    """`tulip-serve`: Tulip and ROSE alone, for Ivy gateways elsewhere (`--tulip-endpoint`)."""
    sys.argv[0] = "tulip-serve"
    main()
