"""The tool's name and its progress lines, shared by every ``scanweaver-tvm`` subcommand: each
slow step says on stderr what it is doing and how long it took, and turns an unexpected
exception into the one-line ``CLIError`` the CLI prints."""
import contextlib
import sys
import time

from .cli_model import CLIError, _describe

PROG = "scanweaver-tvm"


class _Steps:
    """Progress lines on stderr ('importing X ... done in 3.2 s') and the error context of each
    step: an unexpected exception inside becomes a CLIError '<failing>: <exception>'."""

    def __init__(self, quiet=False, debug=False):
        self.quiet, self.debug = quiet, debug

    def note(self, text):
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def __call__(self, doing, failing):
        if not self.quiet:
            sys.stderr.write(f"{doing} ... ")
            sys.stderr.flush()
        start = time.perf_counter()
        try:
            yield
        except BaseException as err:
            if not self.quiet:
                sys.stderr.write(f"failed after {time.perf_counter() - start:.1f} s\n")
                sys.stderr.flush()
            if isinstance(err, Exception) and not isinstance(err, CLIError) and not self.debug:
                raise CLIError(f"{failing}: {_describe(err)}") from err
            raise
        if not self.quiet:
            sys.stderr.write(f"done in {time.perf_counter() - start:.1f} s\n")
            sys.stderr.flush()
