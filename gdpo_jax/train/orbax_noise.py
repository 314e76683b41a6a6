"""Keeps a failed orbax restore to the one error the checkpointer reports.

When one array of a checkpoint fails to read, orbax 0.12.8's restore raises the
first error and closes its event loop with the other reads still in flight
(`asyncio_utils._run_sync_via_new_loop`). What is left of them reports itself
for seconds afterwards, dozens of times per restore, each with a page-long
TensorStore spec, on stderr:

* each abandoned read coroutine (`serialization._read_array_index_and_device_put`)
  catches the GeneratorExit of its garbage collection in an ``except
  BaseException`` and raises a new Exception: "Exception ignored in: <coroutine
  ...>" through `sys.unraisablehook`;
* TensorStore's completion callbacks post to the closed loop
  (`call_soon_threadsafe`): "RuntimeError: Event loop is closed", also
  unraisable;
* a read coroutine that never started: CPython's RuntimeWarning "coroutine
  '_read_array_index_and_device_put' was never awaited";
* finished read tasks, their gathering future and TensorStore's futures,
  whose error no one awaited: "Task exception was never retrieved" (or
  Future, _GatheringFuture) on the `asyncio` logger.

`Checkpointer.restore` already names the damaged step and its first error, and
falls back or stops; these reports say nothing more. `quiet_abandoned_reads`,
called once a restore has failed, drops exactly these four kinds for the rest
of the process and passes everything else to the hook and handlers that were
there before.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
import traceback
import warnings
from typing import Any

_ORBAX = "orbax/checkpoint"
_UNRETRIEVED = re.compile(r"\w+ exception was never retrieved")
# A read error's text: orbax's own ("See full TensorStore details") or TensorStore's.
_READ_ERROR_MARKS = (_ORBAX, "TensorStore", "OCDBT database")
_installed = False


def _from_abandoned_read(unraisable: Any) -> bool:
    obj, exc = unraisable.object, unraisable.exc_value
    if inspect.iscoroutine(obj) and _ORBAX in obj.cr_code.co_filename.replace("\\", "/"):
        return True
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        frames = traceback.extract_tb(unraisable.exc_traceback)
        return any(f.name == "call_soon_threadsafe" for f in frames)
    return False


class _UnretrievedRead(logging.Filter):
    """Drops asyncio's "<task or future> exception was never retrieved" when the
    error is a read's: raised in orbax, or TensorStore's (naming its store)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if not _UNRETRIEVED.match(msg):
            return True
        tb = record.exc_info[2] if record.exc_info else None
        in_orbax = any(_ORBAX in f.filename.replace("\\", "/") for f in traceback.extract_tb(tb))
        return not (in_orbax or any(mark in msg for mark in _READ_ERROR_MARKS))


def quiet_abandoned_reads() -> None:
    """Stops the reports of a failed restore's abandoned reads (module
    docstring); idempotent. Every other unraisable exception and asyncio log
    record goes where it went before."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not _from_abandoned_read(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_UnretrievedRead())
    # An abandoned read that never started: CPython warns of the coroutine, not raised.
    warnings.filterwarnings(
        "ignore",
        message=r"coroutine '_read_array_index_and_device_put' was never awaited",
        category=RuntimeWarning,
    )
