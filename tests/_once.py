"""A module fixture's result computed once a session, whichever xdist worker asks first.

pytest-xdist gives each worker its own module fixtures: when both workers run tests
that use one, both set it up. For `tests/test_multihost.py`'s two-process launch
that was two launches side by side, each slowed by the other (221 s and 224 s of
setup in one `-n 2` run of that file, against 100-160 s alone). Its documented
remedy, `--dist loadgroup` with an `xdist_group` mark, does nothing under pytest
9.2 with pytest-xdist 3.8.0: xdist tags the grouped tests' ids through an attribute
(`item._nodeid`) that pytest 9 no longer reads, so the groups never form. Hence
`once_per_session`, the file-lock pattern of xdist's own how-to: the first worker
computes the result under a lock in the directory the workers share, the others
wait for it and read it back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock


def once_per_session(tmp_path_factory: Any, name: str, make: Callable[[Path], Any]) -> Any:
    """`make(directory)`'s result (JSON-able) for this pytest session: computed by the
    first worker to ask, in `<the workers' shared temp dir>/<name>`, and read back
    from its JSON by the others. Without xdist, computed in this process's temp dir.
    A `make` that raises stores nothing: the next worker to ask runs it again."""
    base = Path(tmp_path_factory.getbasetemp())
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    shared = base.parent  # one directory per session, shared by its workers
    with FileLock(str(shared / f"{name}.lock")):
        done = shared / f"{name}.json"
        if done.exists():
            return json.loads(done.read_text())
        directory = shared / name
        directory.mkdir(exist_ok=True)
        result = make(directory)
        done.write_text(json.dumps(result))
        return result
