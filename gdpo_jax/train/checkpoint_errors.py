"""Why a checkpoint did not restore: its errors, and the rule telling damage (the same
bad bytes on every read) from a read that failed now (the storage or the process)."""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator

import jax

__all__ = [
    "CheckpointUnavailableError",
    "DamagedCheckpointError",
    "IncompatibleCheckpointError",
    "short_error",
    "unreadable_now",
]


class IncompatibleCheckpointError(ValueError):
    """The checkpoint was written by a run whose config differs in fields that matter."""


class DamagedCheckpointError(RuntimeError):
    """No kept checkpoint of the run directory could be read back."""


class CheckpointUnavailableError(RuntimeError):
    """A checkpoint could not be read because of the storage or the process, not its
    content; nothing was moved, a rerun reads it again."""


def short_error(e: BaseException) -> str:
    # TensorStore errors carry a page-long spec dump after the first line.
    first = (str(e).strip().splitlines() or [""])[0].split(" See full TensorStore details")[0]
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__


# Damaged, or unreadable now? Orbax lists only finalized steps (a killed save's tmp
# dir never reaches restore), so a listed step that fails to read either has bad
# bytes or met a bad moment, and only the first may be moved aside:
# * Damage is in the bytes and the same on every read: a truncated or missing array
#   file (TensorStore OUT_OF_RANGE, FAILED_PRECONDITION "Truncated Zstd-compressed
#   stream", NOT_FOUND), truncated or missing metadata (JSONDecodeError,
#   FileNotFoundError), a tree that no longer matches (ValueError, KeyError).
# * Unreadable now says nothing about the bytes: the OS failed or refused the I/O
#   (any OSError but a missing path: EIO, ETIMEDOUT, ENOSPC, ESTALE, PermissionError,
#   ConnectionError...), which TensorStore reports in its message as "[os_error_code=
#   'N']" (older: "[OS error N: ...]") whatever its status (ENOTCONN of a dead mount
#   is FAILED_PRECONDITION, as a truncated file is), or, from a network store, as an
#   UNAVAILABLE, DEADLINE_EXCEEDED, PERMISSION_DENIED... status (absl maps EIO and
#   other unlisted errnos to UNKNOWN); host memory ran out; the JAX runtime failed to
#   place the arrays (device memory). Moving the step aside would then resume from an
#   older one and drop the newest progress without a word, so the restore stops
#   instead, moving nothing.
# The exception type alone cannot always tell (a short read on a network filesystem
# looks like a truncated file), so each step is read twice before it counts as
# damaged, and an unreadable-now error in either read wins. An error in neither list
# counts as damage, as before: it is read twice and the step is moved, never deleted.
# KeyboardInterrupt and SystemExit are not caught at all.
_ABSENT = (FileNotFoundError, NotADirectoryError, IsADirectoryError)  # and their errnos:
_ABSENT_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR})
_OS_ERROR = re.compile(r"(?:\[OS error |os_error_code=')(\d+)")
_STORE_STATUS = re.compile(
    r"\b(UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|PERMISSION_DENIED|"
    r"UNAUTHENTICATED|ABORTED|CANCELLED|UNKNOWN): "
)


def _chain(e: BaseException) -> Iterator[BaseException]:
    """`e` and every error it was raised from or during (orbax wraps TensorStore's)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [x.__cause__, x.__context__, *getattr(x, "exceptions", ())]


def unreadable_now(e: BaseException) -> BaseException | None:
    """The error in `e`'s chain saying the storage or the process failed, not the
    step's bytes; None when there is none (damage)."""
    for x in _chain(e):
        if isinstance(x, (MemoryError, jax.errors.JaxRuntimeError)):
            return x
        if isinstance(x, OSError) and not isinstance(x, _ABSENT):
            return x
        text = str(x)
        if _STORE_STATUS.search(text):
            return x
        if any(int(n) not in _ABSENT_ERRNOS for n in _OS_ERROR.findall(text)):
            return x
    return None
