"""Two processes on one CPU machine (gloo collectives, loopback coordinator):
the 2-process step (each host feeding only its own rows) equals the 1-process step."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nproc: int, tmp_path) -> list[dict]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env["PYTHONPATH"] = ROOT
    outs = [str(tmp_path / f"p{nproc}_{i}.json") for i in range(nproc)]
    procs = [subprocess.Popen([sys.executable, "-m", "tests._multihost_worker", str(i), str(nproc),
                               str(port), outs[i]], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(nproc)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [json.load(open(o)) for o in outs]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    import jax
    from tests._multihost_worker import run_step
    one = run_step(jax.devices()[:4])          # this process, 4 of its 8 fake devices
    assert one["rows"] == [0, 16]
    two = _launch(2, tmp_path)
    assert [r["rows"] for r in two] == [[0, 8], [8, 16]]
    for r in two:
        for k, v in one["metrics"].items():
            np.testing.assert_allclose(r["metrics"][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(r["param_sums"], one["param_sums"], rtol=1e-5)
    assert one["metrics"]["loss"] != 0.0 and one["metrics"]["kl"] > 0
