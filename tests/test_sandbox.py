"""Sandbox: benign programs, and hostile ones that must each end as a failed
test case within their limits while this (the runner's) process survives."""

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from gdpo_jax.rewards import RewardRunner, RewardSpec
from gdpo_jax.rewards import isolation as isolation_mod
from gdpo_jax.rewards import sandbox as sb

ISO = sb.isolation()
FAST = sb.SandboxLimits(cpu_s=1, wall_s=2)
full = pytest.mark.skipif(
    ISO.mode != "namespaces", reason=f"needs namespaces isolation, have {ISO.mode}"
)
# As root, RLIMIT_NPROC is ignored: only a dropped uid (or a non-root userns) bounds a fork bomb.
nproc_holds = ISO.uid_drop or (ISO.mode == "userns" and os.geteuid() != 0)


def run1(src, stdin="", limits=FAST, **kw):
    res = sb.run_program(src, [stdin], limits=limits, **kw)
    assert len(res.cases) == 1
    return res, res.cases[0]


def sandbox_uid_procs():
    lo = sb._UIDS._base
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if lo <= os.stat(f"/proc/{pid}").st_uid < lo + 64:
                    out.append(int(pid))
            except OSError:
                pass
    return out


def test_isolation_is_recorded():
    assert ISO.mode in sb.MODES
    if os.geteuid() == 0 and isolation_mod._probe(["unshare", *sb._NS_FLAGS, "true"]):
        assert ISO == sb.Isolation("namespaces", True, True, True, True)
    with pytest.raises(ValueError, match="isolation mode"):
        sb.isolation("chroot")


def test_stderr_keeps_the_traceback_after_long_output():
    # The driver kept the last 2000 characters of stderr's first 4 KiB: a
    # traceback after more output than that was lost. It now reads the file's end.
    src = "import sys\nsys.stderr.write('x' * 10000 + '\\n')\nraise ValueError('the end')\n"
    (c,) = sb.run_program(src, [""], limits=FAST).cases
    assert c.status == "runtime_error"
    assert "ValueError: the end" in c.stderr and len(c.stderr) <= 2000


def test_benign_stdin_and_call_modes():
    res = sb.run_program(
        "a, b = map(int, input().split())\nprint(a + b)\n", ["1 2", ["3 4"], "x y"]
    )
    assert [c.status for c in res.cases] == ["ok", "ok", "runtime_error"]
    assert [c.stdout for c in res.cases[:2]] == ["3\n", "7\n"]
    assert "ValueError" in res.cases[2].stderr and res.has_error
    res = sb.run_program(
        "class Solution:\n    def f(self, a, b):\n        return (a + b, {1})\n",
        [[1, 2]],
        fn_name="f",
    )
    assert res.cases[0].value == [3, [1]] and not res.has_error
    res = sb.run_program("def f(:\n", [[1]], fn_name="f")
    assert res.compile_error.startswith("SyntaxError") and res.has_error


def test_stdlib_imports_work_for_the_test_uid():
    _, c = run1("import xml.dom.minidom, sqlite3, json\nprint('ok')\n")
    if ISO.private_tmp or not ISO.uid_drop:
        assert c.status == "ok", c.stderr


def test_infinite_loop_times_out():
    t0 = time.monotonic()
    _, c = run1("while True:\n    pass\n")
    assert c.status == "timeout" and time.monotonic() - t0 < 8


def test_sleeping_program_hits_the_wall_clock():
    _, c = run1("import time\ntime.sleep(60)\n", limits=sb.SandboxLimits(cpu_s=5, wall_s=0.5))
    assert c.status == "timeout" and c.time_s < 3


def test_total_wall_time_bounds_the_whole_program():
    lim = sb.SandboxLimits(cpu_s=5, wall_s=5, total_wall_s=1.0)
    res = sb.run_program("import time\ntime.sleep(60)\n", ["", ""], limits=lim)
    assert [c.status for c in res.cases] == ["timeout", "timeout"] and res.wall_s < 4


@pytest.mark.skipif(not nproc_holds, reason=f"RLIMIT_NPROC does not bind in mode {ISO.mode}")
def test_fork_bomb_is_contained():
    src = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    _, c = run1(src)
    assert c.status in ("timeout", "killed") and time.monotonic() - t0 < 8
    assert sandbox_uid_procs() == []
    assert run1("print('after')")[1].stdout == "after\n"


def test_memory_bomb_fails():
    # CPU time to spare: reaching 256 MB takes 0.15 s on an idle 2-core VM, but its page
    # faults were charged over 2 s of CPU on a loaded one (a `timeout` under cpu_s=2).
    _, c = run1(
        "a = []\nwhile True:\n    a.append(bytearray(10**7))\n",
        limits=sb.SandboxLimits(cpu_s=10, wall_s=20, memory_mb=256),
    )
    assert c.status in ("memory_error", "killed")
    _, c = run1("x = bytearray(2**34)\n")
    assert c.status == "memory_error"


def test_huge_output_is_capped():
    lim = sb.SandboxLimits(cpu_s=2, wall_s=4, fsize_mb=1, output_bytes=1000)
    _, c = run1("while True:\n    print('y' * 1000)\n", limits=lim)
    assert c.status == "output_limit" and len(c.stdout) == 1000 and c.truncated


@full
def test_writes_outside_its_dir_do_not_land(tmp_path):
    tag = uuid.uuid4().hex
    targets = [
        str(tmp_path / f"{tag}.txt"),
        f"/tmp/gdpo_escape_{tag}",
        f"/var/tmp/gdpo_escape_{tag}",
        f"/dev/shm/gdpo_escape_{tag}",
        os.path.join(os.getcwd(), f"gdpo_escape_{tag}"),
        os.path.join(os.path.dirname(sb._base_dir()), f"gdpo_escape_{tag}"),
    ]
    src = (
        f"import os\nfor p in {targets!r} + ['../gdpo_escape_{tag}']:\n    try:\n"
        "        open(p, 'w').write('x')\n        print('escaped', p)\n"
        "    except OSError:\n        pass\n"
        "open('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n"
    )
    _, c = run1(src)
    for p in targets + [os.path.join(sb._base_dir(), f"gdpo_escape_{tag}")]:
        assert not os.path.exists(p), p
    assert c.stdout.endswith("fine\n")  # its own directory is writable
    assert str(tmp_path) not in c.stdout  # the test's own dir is out of reach


@full
def test_parent_environment_is_invisible(monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("GDPO_SANDBOX_SECRET", secret)
    src = (
        "import os, glob\nprint(dict(os.environ))\n"
        "for p in glob.glob('/proc/*/environ') + ['/proc/%d/environ' % os.getppid()]:\n"
        "    try:\n        print(open(p).read())\n    except OSError as e:\n        print(p, e)\n"
        f"print(open('/proc/{os.getpid()}/environ').read())\n"
    )
    _, c = run1(src)
    assert secret not in c.stdout and secret not in c.stderr
    assert "GDPO_SANDBOX_SECRET" not in c.stdout


@full
def test_network_connection_fails():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    try:
        src = (
            "import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n"
        )
        _, c = run1(src)
        assert c.status == "runtime_error" and "connected" not in c.stdout
        with pytest.raises(socket.timeout):
            srv.accept()
    finally:
        srv.close()


@pytest.mark.skipif(not ISO.uid_drop and not ISO.pid_namespace, reason="parent shares the uid")
def test_killing_its_parent_leaves_the_runner_alive():
    me = os.getpid()
    src = (
        f"import os, signal\nfor pid in (os.getppid(), {me}, 1):\n"
        "    try:\n        os.kill(pid, 9)\n    except OSError:\n        pass\n"
        "import time\ntime.sleep(0.2)\nprint('alive')\n"
    )
    _, c = run1(src)
    # the driver survived its child: the case finished and was reported
    assert c.status == "ok" and c.stdout == "alive\n"
    _, c = run1("import os\nos.kill(os.getppid(), 9)\nprint('killed it')\n")
    if ISO.uid_drop:  # another uid: the kill is refused, the program fails
        assert c.status == "runtime_error" and "PermissionError" in c.stderr
    else:  # userns: the driver is the pid namespace's init, the signal is dropped
        assert c.status == "ok" and c.stdout == "killed it\n"
    assert run1("print(1)")[1].stdout == "1\n"


def test_hostile_batch_through_the_reward_runner():
    tests = {"inputs": ["2\n"], "outputs": ["4\n"], "fn_name": None}
    comps = [
        "```python\nwhile True: pass\n```",
        "```python\nimport os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n```"
        if nproc_holds
        else "```python\nraise SystemExit(3)\n```",
        "```python\nprint(int(input()) * 2)\n```",
        "```python\nprint(int(input()) ** 3)\n```",
    ]
    kw = {"cpu_s": 1, "wall_s": 2}
    ex = [{"tests": tests}] * 4
    specs = [RewardSpec("code_pass_rate", kwargs=kw), RewardSpec("code_bug", kwargs=kw)]
    with RewardRunner(specs, num_workers=4, timeout_s=20, on_error="raise") as r:
        R, info = r(["q"] * 4, comps, ex)
    np.testing.assert_array_equal(R[:, 0], [0, 0, 1, 0])
    assert R[2, 1] == 1 and R[3, 1] == 1 and R[0, 1] == 1  # a timeout alone is not a bug


def test_stdin_stdout_idioms():
    src = (
        "import sys\nn = int(sys.stdin.buffer.readline())\nrest = sys.stdin.read().split()\n"
        "sys.stdout.buffer.write(str(n + len(rest)).encode() + b'\\n')\nprint('x', end='')\n"
    )
    _, c = run1(src, "3\na b\nc\n")
    assert c.status == "ok" and c.stdout == "6\nx"
    _, c = run1("print(open(0).read().upper())", "hi")
    assert c.stdout == "HI\n"


def test_the_program_ends_as_under_cpython():
    """What CPython does at exit, the sandbox does (os._exit skipped it): a non-daemon
    thread runs to its end and atexit handlers run; a closed or None sys.stdout is no
    error; only SystemExit(None / 0 / False) is success (SystemExit(0.0) passed);
    sys.stdout.mode and .name exist (FastIO templates read them)."""
    ok = {
        "import threading\nthreading.Thread(target=lambda: print(42)).start()": "42\n",
        "import atexit\natexit.register(print, 42)": "42\n",
        "import sys\nprint(42)\nsys.stdout.close()": "42\n",
        "import sys\nprint(42)\nsys.stdout = None": "42\n",
        "import io, sys\nprint(42)\nsys.stdout = io.StringIO()": "42\n",
        "import sys\nprint(sys.stdin.mode, sys.stdout.mode, sys.stdout.name)": ("r w <stdout>\n"),
        "raise SystemExit(False)": "",
    }
    for src, out in ok.items():
        _, c = run1(src)
        assert (c.status, c.stdout) == ("ok", out), src
    for code in ("0.0", "'0'", "1", "True"):
        _, c = run1(f"raise SystemExit({code})")
        assert c.status == "runtime_error", code


def test_cpu_time_over_the_limit_is_a_timeout_even_when_the_program_exits():
    # RLIMIT_CPU counts whole seconds (cpu_s=0.3 became 1) and SIGXCPU can be ignored:
    # a program that burned 0.6 s of CPU under cpu_s=0.3 and exited was "ok".
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass\n"
    for src in (burn, "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n" + burn):
        _, c = run1(src + "print(42)", limits=sb.SandboxLimits(cpu_s=0.3, wall_s=3))
        assert c.status == "timeout" and c.stdout == "42\n", src
    _, c = run1(burn + "print(42)", limits=sb.SandboxLimits(cpu_s=2, wall_s=3))
    assert c.status == "ok"


def _force_as_root(monkeypatch, mode: str) -> None:
    """Root is refused "rlimits" (no process limit) and "userns" (its namespace's root is
    the host's root); as root the tests of those modes' runner force their Isolation
    where the machine can run it: the driver's code is the same for any uid."""
    if os.geteuid() != 0 or mode not in ("rlimits", "userns"):
        return
    probe = ["unshare", "--user", "--map-root-user", *sb._NS_FLAGS, "true"]
    if mode == "userns" and not (shutil.which("unshare") and isolation_mod._probe(probe)):
        return  # sb.isolation("userns") raises: the test skips
    real = sb.isolation

    def forced(m: str = "auto", allow_weak: bool = False) -> sb.Isolation:
        return isolation_mod._build(mode, True) if m == mode else real(m, allow_weak)

    monkeypatch.setattr(sb, "isolation", forced)


@pytest.mark.parametrize("mode", ["userns", "setuid", "rlimits"])
def test_weaker_modes_run_benign_programs(mode, monkeypatch):
    _force_as_root(monkeypatch, mode)
    try:
        iso = sb.isolation(mode)
    except RuntimeError as e:
        pytest.skip(str(e))
    assert iso.mode == mode and iso.note
    res = sb.run_program(
        "import heapq\nprint(sum(map(int, input().split())))\n",
        ["1 2", "x"],
        isolation_mode=mode,
        limits=FAST,
    )
    assert [c.status for c in res.cases] == ["ok", "runtime_error"] and res.cases[0].stdout == "3\n"
    assert res.isolation == mode


# Issue #13 item 7: every failure the program causes is the program's failure
# (pass 0 / bug 1); only a fault of the machine is sandbox_error (scored NaN).
HOSTILE = {
    "exit_97": "import os\nos._exit(97)\n",  # the driver's old private "setup failed" code
    "sum_3000": "x = " + "+".join(["1"] * 3000) + "\nprint(x)\n",  # RecursionError in compile()
    "unary_minus": "x = " + "-" * 100_000 + "1\n",  # MemoryError in compile()
    "fake_result_line": 'print(\'{"setup_error": "forged"}\')\nimport sys\nsys.exit(1)\n',
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_program_failures_are_never_sandbox_errors(name):
    res = sb.run_program(HOSTILE[name], ["", ""], limits=FAST)
    assert res.sandbox_error is None
    assert [c.status for c in res.cases] == ["runtime_error"] * 2 and res.has_error


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_programs_score_pass_0_bug_1(name):
    from gdpo_jax.tasks import code

    comp = [f"```python\n{HOSTILE[name]}```"]
    tests = [{"inputs": ["1\n"], "outputs": ["1\n"], "fn_name": None}]
    kw = {"cpu_s": 1, "wall_s": 2}
    assert code.pass_rate_reward(None, comp, tests=tests, **kw) == [0.0]
    # code_bug is 1 when bug-FREE: a failing program scores 0, never NaN.
    assert code.bug_reward(None, comp, tests=tests, **kw) == [0.0]


@pytest.mark.parametrize("mode", ["rlimits", "userns"])
def test_driver_cannot_be_forged_through_proc(mode, monkeypatch):
    # Same uid as the driver: /proc/<driver>/fd/1 would reach its result pipe
    # were the driver dumpable (and the test process kept CAP_SYS_PTRACE as
    # root, or as root of its user namespace).
    _force_as_root(monkeypatch, mode)
    try:
        sb.isolation(mode)
    except RuntimeError as e:
        pytest.skip(str(e))
    src = (
        "import os\nfd = os.open(f'/proc/{os.getppid()}/fd/1', os.O_WRONLY)\n"
        'os.write(fd, b\'{"setup_error": "forged"}\\n\')\n'
    )
    res = sb.run_program(src, [""], limits=FAST, isolation_mode=mode)
    assert res.sandbox_error is None and res.cases[0].status == "runtime_error"
    assert "PermissionError" in res.cases[0].stderr


def test_program_killing_its_driver_fails_as_the_program(monkeypatch):
    # rlimits mode: same uid, so the kill succeeds; the rest of the run is lost
    # to the program, which is its failure, not the machine's. Root is refused
    # rlimits (no process limit), so as root the test forces that Isolation:
    # what it checks is how the runner reads a driver that died mid-run.
    _force_as_root(monkeypatch, "rlimits")
    src = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(1)\n"
    res = sb.run_program(src, ["", ""], limits=FAST, isolation_mode="rlimits")
    assert res.sandbox_error is None
    assert [c.status for c in res.cases] == ["killed", "killed"] and res.has_error
    assert "stopped early" in res.cases[0].stderr


def test_machine_faults_are_sandbox_errors(monkeypatch):
    # A test process whose own set-up fails (here: an impossible RLIMIT_NOFILE)
    # never ran the program: NaN, whatever exit code it ended with.
    res = sb.run_program("print(1)", ["", ""], limits=sb.SandboxLimits(nofile=10**9))
    assert [c.status for c in res.cases] == ["sandbox_error"] * 2 and res.sandbox_error
    from gdpo_jax.tasks import code

    comp, tests = ["```python\nprint(1)\n```"], [{"inputs": [""], "outputs": ["1\n"]}]
    assert np.isnan(code.pass_rate_reward(None, comp, tests=tests, nofile=10**9)[0])
    # The sandbox binary cannot start.
    monkeypatch.setattr(sb.sys, "executable", "/nonexistent/python")
    monkeypatch.setattr(sb.shutil, "which", lambda _: "/nonexistent/unshare")
    res = sb.run_program("print(1)", [""], limits=FAST)
    assert res.cases[0].status == "sandbox_error" and "cannot start" in res.sandbox_error


@pytest.fixture
def probes(monkeypatch):
    """isolation() re-probed with a fake `unshare` probe; the real one restored after."""

    def use(ok):
        monkeypatch.setattr(isolation_mod, "_probe", lambda cmd: ok(cmd))
        sb.isolation.cache_clear()

    yield use
    sb.isolation.cache_clear()


def test_weak_isolation_is_opt_in(probes, caplog):
    # Issue #13 item 8: no namespaces -> "auto" used to fall back silently.
    probes(lambda cmd: False)
    want = "rlimits" if os.geteuid() else "setuid"
    with pytest.raises(RuntimeError, match=f"allows is '{want}'.*sandbox.allow_weak=True"):
        sb.isolation()
    with caplog.at_level("WARNING", logger="gdpo_jax.sandbox"):
        iso = sb.isolation(allow_weak=True)
    assert iso.mode == want and not iso.network_isolated
    assert f"mode '{want}'" in caplog.text and "no network isolation" in caplog.text
    # Naming the weak mode is the opt-in; it still warns.
    caplog.clear()
    with caplog.at_level("WARNING", logger="gdpo_jax.sandbox"):
        assert sb.isolation(want).mode == want
    assert "WEAKER THAN 'namespaces'" in caplog.text
    with pytest.raises(RuntimeError, match="allow_weak"):
        sb.run_program("print(1)", [""], limits=FAST)


def test_rlimits_is_refused_as_root(monkeypatch):
    # Linux exempts uid 0 from RLIMIT_NPROC: in rlimits mode (no uid drop) a
    # root test process had no process limit at all. Root gets "setuid" instead.
    sb.isolation.cache_clear()
    try:
        monkeypatch.setattr(isolation_mod.os, "geteuid", lambda: 0)
        with pytest.raises(RuntimeError, match="'rlimits' is refused as root.*Use 'setuid'"):
            sb.isolation("rlimits", allow_weak=True)
        sb.isolation.cache_clear()
        monkeypatch.setattr(isolation_mod.os, "geteuid", lambda: 1000)
        iso = sb.isolation("rlimits")
        assert iso.mode == "rlimits" and not iso.uid_drop
    finally:
        sb.isolation.cache_clear()


def test_userns_fallback_warns_but_runs(probes, caplog, monkeypatch):
    monkeypatch.setattr(isolation_mod.os, "geteuid", lambda: 1000)
    probes(lambda cmd: "--user" in cmd)
    with caplog.at_level("WARNING", logger="gdpo_jax.sandbox"):
        iso = sb.isolation()
    assert iso.mode == "userns" and "keeps the caller's uid" in caplog.text


def test_userns_is_refused_as_root(probes, monkeypatch):
    # As root, `unshare --map-root-user` maps the namespace's root to the host's root:
    # dropped capabilities or not, the program owned root's files and /proc/sys (it could
    # write kernel.core_pattern, or chmod the interpreter through /proc/self/exe). "auto"
    # fell back to it as root wherever namespaces failed and user namespaces worked.
    monkeypatch.setattr(isolation_mod.os, "geteuid", lambda: 0)
    probes(lambda cmd: "--user" in cmd)
    with pytest.raises(RuntimeError, match="'userns' is refused as root.*Use 'namespaces'"):
        sb.isolation("userns")
    with pytest.raises(RuntimeError, match="allows is 'setuid'"):
        sb.isolation()  # the next mode down, weak: opt-in only
    assert sb.isolation(allow_weak=True).mode == "setuid"


@pytest.mark.skipif(os.geteuid() != 0, reason="what userns as root would be: needs root")
def test_userns_as_root_maps_the_programs_root_to_the_hosts(monkeypatch):
    # Why root is refused "userns": forced, the test process's uid 0 is the host's uid 0
    # (one line "0 0 1" in its uid_map), which owns /proc/sys whatever its capabilities.
    _force_as_root(monkeypatch, "userns")
    try:
        sb.isolation("userns")
    except RuntimeError as e:
        pytest.skip(str(e))
    src = (
        "import os\nprint(open('/proc/self/uid_map').read().split(),\n"
        "      os.access('/proc/sys/kernel/core_pattern', os.W_OK))\n"
    )
    _, case = run1(src, isolation_mode="userns")
    assert (case.status, case.stdout) == ("ok", "['0', '0', '1'] True\n"), case.stderr
    _, case = run1(src, isolation_mode="namespaces")  # the uid drop: no host root inside
    assert case.status == "ok" and case.stdout.endswith(" False\n"), case


def test_sandbox_preloads_only_the_modules_a_source_names_and_runs_no_site_hooks(monkeypatch):
    """The driver imports a preload module only if the source names it (importing all of
    them was most of every program's cost), starts with -S (no `site`: no .pth hook, such as an
    editable install's finder, runs in the sandbox), and still puts site-packages on
    the path, so what a program could import before it still can. It does not import
    `traceback` either (a failing program's traceback is the interpreter's own display)."""
    # The module names are built at run time, so this source names none of them.
    probe = (
        "import sys\n"
        "names = ['deci' + 'mal', 'frac' + 'tions', 'stat' + 'istics', 'hea' + 'pq',\n"
        "         'trace' + 'back']\n"
        "print(sorted(m for m in names if m in sys.modules), sys.flags.no_site,\n"
        "      any('editable' in m for m in sys.modules))\n"
    )
    assert sb._named(probe, sb.DEFAULT_PRELOAD) == []
    _, case = run1(probe)
    assert case.status == "ok" and case.stdout.split("\n")[0] == "[] 1 False"
    _, case = run1("import heapq\n" + probe)
    assert case.status == "ok" and case.stdout.startswith("['heapq'] 1 False")
    # Named in a comment or a string counts too (a superset of what can be imported).
    assert sb._named("# uses fractions\nx = 'decimal'\n", sb.DEFAULT_PRELOAD) == [
        "decimal",
        "fractions",
    ]
    # site-packages are on the program's path (whether the test uid may read them depends
    # on the directories' modes: a clone under a 0700 directory is not readable to it)...
    _, case = run1("import sys\nprint(repr(sys.path))\n")
    assert case.status == "ok" and sb._site_paths()
    assert all(p in case.stdout for p in sb._site_paths()), case.stdout
    # ...and where it keeps our uid (userns mode, when this host allows it), importable.
    _force_as_root(monkeypatch, "userns")
    try:
        sb.isolation("userns")
    except RuntimeError as e:
        pytest.skip(f"the import half needs userns mode: {e}")
    _, case = run1("import numpy\nprint(numpy.__name__)\n", isolation_mode="userns")
    assert case.status == "ok" and case.stdout == "numpy\n", case.stderr


def test_driver_imports_no_json_or_enum_in_stdin_mode_and_output_round_trips():
    """The job travels as marshal and the driver's lines as ascii() dict literals, so a
    stdin-mode program's interpreter never imports json, signal's enum or re (about 8 ms
    of every program's start); call mode imports json for the return value. Whatever a
    program prints (newlines, quotes, NUL, non-ASCII, a line that looks like a driver
    record) comes back exactly, and a return value comes back JSON-decoded."""
    probe = (
        "import sys\n"
        "names = ['js' + 'on', 'en' + 'um', 'r' + 'e', 'sig' + 'nal']\n"
        "print(sorted(m for m in names if m in sys.modules))\n"
    )
    _, case = run1(probe)
    assert case.status == "ok" and case.stdout == "[]\n", case.stdout
    res = sb.run_program(probe.replace("print(", "def f():\n    return ("), [[]], fn_name="f")
    assert res.cases[0].status == "ok" and "json" in res.cases[0].value
    awkward = "é ✓ \"q\" 'q' \\ \x00 \t end\n{'case': 0, 'result': {}}\n"
    _, case = run1(f"import sys\nsys.stdout.write({awkward!r})\n")
    assert case.status == "ok" and case.stdout == awkward
    res = sb.run_program(
        "def f(x):\n    return {'k': [x, 'é\\n', None, 1.5]}\n", [["\u2713"]], fn_name="f"
    )
    assert res.cases[0].value == {"k": ["\u2713", "é\n", None, 1.5]}


# --- Audit fixes: a program's doing is always the program's failure, never a crash
# of the trainer, a runner timeout or NaN.


def _descendants(root: int) -> dict[int, str]:
    """{pid: cmdline} of every live (not zombie) process below `root`."""
    kids: dict[int, list[int]] = {}
    cmd: dict[int, str] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat[0] != "Z":
            kids.setdefault(int(stat[1]), []).append(int(p))
            cmd[int(p)] = line
    out, todo = {}, [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out[c] = cmd[c]
            todo.append(c)
    return out


def _drivers_below(root: int) -> list[int]:
    return [p for p, c in _descendants(root).items() if "_sandbox_driver.py" in c]


def test_runner_deadline_bounds_the_sandbox():
    """A program's total wall time (2 s + n_cases * (wall_s + 0.25), 11 s here) used to
    outlive the runner's deadline (3 s): RewardError (or NaN for the chunk) and an
    abandoned sandbox running on. The runner now passes its deadline, the programs of a
    chunk share it (the loop cannot eat the good program's time), the loop's unrun
    cases are timeouts (pass 0, no bug) and nothing of the sandbox is left running."""
    n = 12
    tests = {"inputs": ["2\n"] * n, "outputs": ["4\n"] * n, "fn_name": None}
    comps = ["```python\nwhile True: pass\n```", "```python\nprint(int(input()) * 2)\n```"]
    kw = {"cpu_s": 0.5, "wall_s": 0.5}
    specs = [RewardSpec("code_pass_rate", kwargs=kw), RewardSpec("code_bug", kwargs=kw)]
    t0 = time.monotonic()
    with RewardRunner(specs, num_workers=2, chunk_size=2, timeout_s=3, on_error="raise") as r:
        R, info = r(["q"] * 2, comps, [{"tests": tests}] * 2)
    assert time.monotonic() - t0 < 3.5
    np.testing.assert_array_equal(R, [[0, 1], [1, 1]])
    assert info["reward_timeouts/code_pass_rate"] == info["reward_timeouts/code_bug"] == 0
    assert _drivers_below(os.getpid()) == []
    # run_program itself: ends before the deadline; what had no time is "timeout".
    t0 = time.monotonic()
    res = sb.run_program("while True: pass", [""] * 4, limits=FAST, deadline=t0 + 1.0)
    assert time.monotonic() - t0 < 1.0 and res.sandbox_error is None
    assert [c.status for c in res.cases] == ["timeout"] * 4


def test_sandbox_dies_with_its_caller():
    """A caller that dies (a killed process-pool worker, a crashed trainer) used to leave
    its sandbox running to the end of its cases; the driver now sees its result pipe
    close, kills the case and exits."""
    script = (
        "from gdpo_jax.rewards import sandbox as sb\nsb.isolation()\nprint('go', flush=True)\n"
        "sb.run_program('import time\\ntime.sleep(60)', [''], "
        "limits=sb.SandboxLimits(cpu_s=5, wall_s=60))\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    procs = {}
    try:
        assert p.stdout.readline() == b"go\n"
        t0 = time.monotonic()
        while len(_drivers_below(p.pid)) < 2 and time.monotonic() - t0 < 5:
            time.sleep(0.02)  # until the driver and its forked test process run
        # The namespace modes add `unshare` (its command line names the driver too): 2 or
        # 3 such processes, the last of them forked a moment later.
        time.sleep(0.3)
        procs = _descendants(p.pid)
        assert len(_drivers_below(p.pid)) >= 2, procs
        p.kill()
        p.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3 and set(procs) & set(_descendants(1)):
            time.sleep(0.05)
        left = set(procs) & set(_descendants(1))
        assert not left, [procs[q] for q in left]
    finally:
        p.kill()
        p.wait()
        for q in procs:  # the old driver ran on: end what this test started
            try:
                os.kill(q, 9)
            except OSError:
                pass


def _deep(depth):
    """A program whose return value is `depth` nested lists, written past json.dumps."""
    body = f"os.write(3, b'[' * {depth} + b']' * {depth})\n    os._exit(0)\n"
    return "import os\ndef f():\n    " + body


def test_deeply_nested_return_values_fail_as_the_program():
    # 990 levels passed the driver, then overflowed the recursion limit in the parent
    # (RecursionError out of run_program: a RewardError, a crash of the trainer), from a
    # caller's deep stack as here; 5000 killed the driver: every case "killed".
    def deep_stack(k, fn):
        return fn() if k == 0 else deep_stack(k - 1, fn)

    for depth, why in ((990, "nested deeper than 100"), (5000, "could not be read back")):
        src = _deep(depth)
        res = deep_stack(150, lambda src=src: sb.run_program(src, [[], []], fn_name="f"))
        assert res.sandbox_error is None
        assert [c.status for c in res.cases] == ["runtime_error"] * 2, res.cases
        assert why in res.cases[0].stderr
    res = sb.run_program(_deep(100), [[]], fn_name="f")
    assert res.cases[0].status == "ok"  # 100 levels are accepted


def test_large_return_value_has_its_own_limit():
    # A correct 130 KB return value was read with the 64 KiB stdout cap (output_bytes),
    # cut, and failed as "could not be read back". It has its own limit, value_bytes;
    # past it the case is an output_limit failure.
    src = "def f(n):\n    return list(range(n))\n"
    res = sb.run_program(src, [[20000]], fn_name="f", limits=FAST)
    assert res.cases[0].status == "ok" and res.cases[0].value == list(range(20000))
    lim = sb.SandboxLimits(cpu_s=1, wall_s=2, value_bytes=1000)
    (c,) = sb.run_program(src, [[20000]], fn_name="f", limits=lim).cases
    assert c.status == "output_limit" and "value_bytes=1000" in c.stderr and c.value is None


def _pid_ns_mode(mode, monkeypatch):
    _force_as_root(monkeypatch, mode)
    try:
        sb.isolation(mode)
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("mode", ["namespaces", "userns"])
def test_program_cannot_block_the_next_case_files(mode, monkeypatch):
    # The driver put case i's files at /tmp/.gdpo_io/{in,out,err,res}i: a program that
    # made directories there (userns: it owns that directory) failed the next case's
    # set-up, a "sandbox_error" that scored the whole program NaN. The files are nameless now.
    _pid_ns_mode(mode, monkeypatch)
    src = (
        "import os\nfor k in ('in', 'out', 'err', 'res'):\n    for i in range(4):\n"
        "        try:\n            os.mkdir(f'/tmp/.gdpo_io/{k}{i}')\n"
        "        except OSError:\n            pass\nprint('x')\n"
    )
    res = sb.run_program(src, ["", "", ""], limits=FAST, isolation_mode=mode)
    assert res.sandbox_error is None
    assert [(c.status, c.stdout) for c in res.cases] == [("ok", "x\n")] * 3


@pytest.mark.parametrize("mode", ["namespaces", "userns", "rlimits"])
def test_setsid_daemon_does_not_survive_its_case(mode, monkeypatch):
    # A daemon in its own session escaped the process-group kill (userns, and rlimits
    # until the driver killed its whole subreaper tree): it ran on through the next
    # cases (and could kill their test processes during set-up).
    _pid_ns_mode(mode, monkeypatch)
    src = (
        "import os, time\nif not os.path.exists('pid'):\n    if os.fork() == 0:\n"
        "        os.setsid()\n        open('pid', 'w').write(str(os.getpid()))\n"
        "        time.sleep(30)\n    time.sleep(0.2)\n    print('started')\nelse:\n"
        "    try:\n        os.kill(int(open('pid').read()), 0)\n        print('alive')\n"
        "    except OSError:\n        print('gone')\n"
    )
    res = sb.run_program(src, ["", ""], limits=FAST, isolation_mode=mode)
    assert [c.stdout for c in res.cases] == ["started\n", "gone\n"], res.cases


# Runs the real driver, but breaks the set-up of every test process after the first:
# as a program's leftovers could (a daemon killing it, ...) where nothing kills them.
_LATE_SETUP_FAILURE = """
import sys
sys.path.insert(0, {rewards!r})
import _sandbox_driver as d
real, n = d._run_case, [0]

def run_case(code, job, *rest):
    n[0] += 1
    if n[0] > 1:
        job = dict(job, limits=dict(job["limits"], nofile=10**9))  # setrlimit fails
    return real(code, job, *rest)

d._run_case = run_case
d.main()
sys.stdout.flush()
"""


def test_setup_failure_after_the_program_ran_is_its_failure(tmp_path, monkeypatch):
    # Only a failure before any of the program's code ran is the machine's (NaN): after
    # a case ran, the program may be the cause. It used to turn the whole program NaN.
    wrapper = tmp_path / "driver.py"
    wrapper.write_text(_LATE_SETUP_FAILURE.format(rewards=os.path.dirname(sb._DRIVER)))
    monkeypatch.setattr(sb, "_DRIVER", str(wrapper))
    res = sb.run_program("print('x')", ["", "", ""], limits=FAST)
    assert res.sandbox_error is None
    assert [c.status for c in res.cases] == ["ok", "runtime_error", "runtime_error"]
    assert "set-up failed after earlier cases" in res.cases[1].stderr and res.has_error


def test_uid_ranges_of_two_processes_never_overlap(monkeypatch):
    # The base was 200000 + (pid % 4000) * 64: pids 4000 apart shared their uids.
    bases = []
    for pid in (1234, 1234 + 4000, 2**22):  # pid_max <= 2**22
        monkeypatch.setattr(sb.os, "getpid", lambda pid=pid: pid)
        bases.append(sb._UidPool()._base)
    monkeypatch.undo()
    assert bases[1] - bases[0] == 4000 * 64
    assert bases[2] + 63 < 2**31 - 1
    # A process forked after import takes its own range. Forked in a fresh interpreter:
    # this test process runs JAX's threads, which a fork here could deadlock.
    script = (
        "import os\nfrom gdpo_jax.rewards import sandbox as sb\nr, w = os.pipe()\n"
        "pid = os.fork()\nif pid == 0:\n    os.write(w, str(sb._UIDS._base).encode())\n"
        "    os._exit(0)\nos.close(w)\nos.waitpid(pid, 0)\n"
        "print(int(os.read(r, 64)), pid, sb._UIDS._base)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    child_base, child, parent_base = map(int, out.stdout.split())
    assert child_base == sb.uid_base(child, sb._pid_namespace()) != parent_base


def test_uid_ranges_of_processes_in_two_pid_namespaces_differ():
    # Two trainers in containers sharing the host's uids but not its pids (both pid 1)
    # took the same range: one's programs counted against the other's RLIMIT_NPROC.
    host = sb._HOST_PID_NS
    assert sb.uid_base(1, host) == 200_000 + 64  # the host's namespace: as before
    a, b = sb.uid_base(1, 4026532001), sb.uid_base(1, 4026532002)
    assert len({a, b, sb.uid_base(1, host)}) == 3
    # Within one namespace, distinct pids still never share a range, and every uid
    # stays under 2**31 - 1.
    pids = [1, 2, 4000, 4001, 2**22 - 1, 2**22]
    for ns in (host, 4026532001):
        bases = sorted(sb.uid_base(p, ns) for p in pids)
        assert all(y - x >= 64 for x, y in zip(bases, bases[1:]))
        assert bases[-1] + 63 < 2**31 - 1


def test_a_killed_process_sandbox_directory_is_removed_by_the_next_one(tmp_path):
    from gdpo_jax.rewards.sandbox_dirs import remove_stale_base_dirs

    # A trainer killed with SIGKILL left its /tmp/gdpo_sandbox_* directory for good.
    script = (
        "import sys, time\nfrom gdpo_jax.rewards.sandbox_dirs import base_dir\n"
        "print(base_dir(), flush=True)\nif sys.argv[1] == 'wait':\n    time.sleep(60)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TMPDIR": str(tmp_path)}

    def start(how):
        p = subprocess.Popen(
            [sys.executable, "-c", script, how], stdout=subprocess.PIPE, text=True, env=env
        )
        return p, p.stdout.readline().strip()

    (tmp_path / "gdpo_sandbox_unlocked").mkdir()  # no owner lock: not ours to judge
    alive, alive_dir = start("wait")
    killed, killed_dir = start("wait")
    try:
        killed.kill()
        killed.wait()
        assert os.path.isdir(killed_dir) and os.path.isdir(alive_dir)
        assert remove_stale_base_dirs(str(tmp_path)) == [killed_dir]
        assert os.path.isdir(alive_dir)  # its owner still runs
    finally:
        alive.kill()
        alive.wait()
        killed.kill()
    # The next process to make one sweeps first (and removes its own at exit).
    p, own = start("exit")
    assert p.wait() == 0 and own not in (alive_dir, killed_dir)
    assert sorted(os.listdir(tmp_path)) == ["gdpo_sandbox_unlocked"]


@pytest.mark.parametrize("pivot", [True, False], ids=["pivot_root", "chroot"])
@pytest.mark.parametrize("mode", ["namespaces", "userns"])
def test_program_sees_a_minimal_root_without_the_hosts_files(mode, pivot, monkeypatch):
    # Without a root of its own a program could read every world-readable host file: the
    # working tree, the task's data (its test cases' expected outputs), the checkpoints.
    # Where pivot_root is refused (Docker's default seccomp profile) the root is entered
    # by move and chroot instead; every program was a sandbox_error there.
    _pid_ns_mode(mode, monkeypatch)
    monkeypatch.setattr(sb, "_PIVOT_ROOT", pivot)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    secrets = [
        os.path.join(root, "README.md"),
        os.path.join(root, "gdpo_jax", "data", "samples", "code_apps.jsonl"),
        os.path.join(root, "tests", "test_sandbox.py"),
    ]
    assert all(os.path.exists(p) for p in secrets)
    planted = os.path.join(sb._site_paths()[0], f"gdpo_planted_{uuid.uuid4().hex}")
    src = (
        f"import os\nfor p in {secrets!r}:\n    print(os.path.exists(p))\n"
        "import numpy, json\nprint(sorted(os.listdir('/')))\n"
        f"try:\n    open({planted!r}, 'w')\n    print('wrote')\n"
        "except OSError as e:\n    print(e.strerror)\n"
        # No way back out of a chroot without CAP_SYS_CHROOT; the devices work but their
        # host inodes cannot be changed (userns as root owns them).
        "os.makedirs('/tmp/w/x')\ntry:\n    os.chroot('/tmp/w/x')\n    print('chrooted')\n"
        "except OSError as e:\n    print(e.strerror)\n"
        "open('/dev/null', 'w').write('x')\n"
        "try:\n    os.chmod('/dev/null', 0o666)\n    print('chmod')\n"
        "except OSError as e:\n    print('refused')\n"
    )
    try:
        _, case = run1(src, limits=sb.SandboxLimits(cpu_s=5, wall_s=10), isolation_mode=mode)
        assert not os.path.exists(planted)
    finally:
        if os.path.exists(planted):
            os.remove(planted)
    assert case.status == "ok", case.stderr
    lines = case.stdout.splitlines()
    assert lines[:3] == ["False"] * 3  # numpy and json still import from the interpreter's trees
    top = set(eval(lines[3]))
    assert {"usr", "etc", "tmp", "proc", "dev"} <= top and not top & {"srv", "mnt", "boot", "media"}
    assert lines[4] == "Read-only file system"  # userns keeps our uid: site-packages is ro
    assert lines[5:] == ["Operation not permitted", "refused"], lines


def _with_site(monkeypatch, *dirs):
    here = sb._site_paths()
    monkeypatch.setattr(sb, "_site_paths", lambda: (*here, *map(str, dirs)))


@pytest.mark.parametrize("mode", ["namespaces", "userns"])
def test_site_packages_under_tmp_stay_importable(mode, tmp_path, monkeypatch):
    # The minimal root is staged under a fresh /tmp: an interpreter or site-packages that
    # lives under the host's /tmp (a CI clone's .venv) must be bound from before it is hidden.
    _pid_ns_mode(mode, monkeypatch)
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "gdpo_probe_mod.py").write_text("VALUE = 42\n")
    _with_site(monkeypatch, site_dir)
    _, case = run1("import gdpo_probe_mod\nprint(gdpo_probe_mod.VALUE)\n", isolation_mode=mode)
    assert (case.status, case.stdout) == ("ok", "42\n"), case.stderr


@pytest.mark.parametrize("mode", ["namespaces", "userns"])
def test_site_packages_reached_through_a_symlink_stay_importable(mode, tmp_path, monkeypatch):
    # A kept path whose target was bound first (a shorter string) or lies in /usr was left
    # out of the new root: every import from it failed (runtime_error, reward 0).
    _pid_ns_mode(mode, monkeypatch)
    real = tmp_path / "s"
    real.mkdir()
    (real / "gdpo_probe_link.py").write_text("VALUE = 7\n")
    link = tmp_path / "a_site_dir_reached_through_a_longer_symlink"
    link.symlink_to(real)
    _with_site(monkeypatch, link)  # the spelling sys.path uses; its target is shorter
    src = "import sys, gdpo_probe_link\nprint(gdpo_probe_link.__file__, gdpo_probe_link.VALUE)\n"
    res = sb.run_program(src, [""], limits=FAST, isolation_mode=mode)
    assert res.sandbox_error is None and res.cases[0].status == "ok", res
    assert res.cases[0].stdout.split()[1] == "7"


@pytest.mark.parametrize("mode", ["namespaces", "userns"])
def test_an_installed_package_data_and_submounts_stay_out_of_reach(mode, tmp_path, monkeypatch):
    # Installed from a wheel, gdpo_jax/data/samples (expected outputs) sat in the bound
    # site-packages; and only the top mount of each bound tree was made read-only, so a
    # writable mount below it stayed writable.
    _pid_ns_mode(mode, monkeypatch)
    site = tmp_path / "site"
    samples = site / "gdpo_jax" / "data" / "samples"
    samples.mkdir(parents=True)
    (samples / "code_apps.jsonl").write_text('{"answer": 1}\n')
    (site / "mnt").mkdir()
    assert sb._hide_paths()[0].endswith("gdpo_jax")  # this package, wherever it lies
    monkeypatch.setattr(sb, "_hide_paths", lambda: [str(site / "gdpo_jax")])
    _with_site(monkeypatch, site)
    script = (
        "import os, sys\nfrom gdpo_jax.rewards import isolation, sandbox as sb\n"
        # As root, userns is forced here as in this process (`_force_as_root`).
        f"if {mode!r} == 'userns' and os.geteuid() == 0:\n"
        "    sb.isolation = lambda *a: isolation._build('userns', True)\n"
        f"sb._site_paths = lambda: {(*sb._site_paths(),)!r}\n"
        f"sb._hide_paths = lambda: {[str(site / 'gdpo_jax')]!r}\n"
        "src = ('import os\\nprint(os.path.exists(%r), os.listdir(%r))\\n'\n"
        '       \'try:\\n    open(%r, "w")\\n    print("wrote")\\n\'\n'
        "       'except OSError as e:\\n    print(e.strerror)\\n')"
        f" % ({str(samples / 'code_apps.jsonl')!r}, {str(site / 'gdpo_jax')!r}, "
        f"{str(site / 'mnt' / 'x')!r})\n"
        f"r = sb.run_program(src, [''], isolation_mode={mode!r}, allow_weak=True)\n"
        "print(r.sandbox_error, r.cases[0].status)\nprint(r.cases[0].stdout, end='')\n"
    )
    # A writable tmpfs below the kept tree, in a mount namespace of this test's own.
    cmd = [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f"mount -t tmpfs -o size=1m,mode=1777 t {site / 'mnt'} && exec {sys.executable} -c \"$0\"",
        script,
    ]  # fmt: skip
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()[-3:]
    assert lines == ["None ok", "False []", "Read-only file system"], out.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
@pytest.mark.parametrize("mount_setattr", [True, False], ids=["mount_setattr", "remount"])
def test_a_read_only_bind_covers_the_mounts_below_it(mount_setattr, tmp_path):
    # `_read_only` makes a bound tree read-only with mount_setattr (Linux 5.12), or on an
    # older kernel by remounting each mount of the tree, found in /proc/self/mountinfo:
    # only the first path ran on this machine. Both must leave a submount read-only too,
    # and a mount point whose name the kernel escapes (a space) must be found.
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "a sub").mkdir(parents=True)
    script = (
        "import os, sys\n"
        f"sys.path.insert(0, {os.path.dirname(sb._DRIVER)!r})\n"
        "import _sandbox_root as r\n"
        f"if not {mount_setattr}:\n"
        "    r._SYS_MOUNT_SETATTR = -1  # ENOSYS, as on a kernel before 5.12\n"
        f"src, dst = {str(src)!r}, {str(dst)!r}\n"
        "r._mount(None, '/', None, r._MS_REC | r._MS_PRIVATE, None)\n"
        "r._mount('tmpfs', src, 'tmpfs', 0, 'size=1m')\n"
        "os.mkdir(src + '/a sub')\n"
        "r._mount('tmpfs', src + '/a sub', 'tmpfs', 0, 'size=1m')\n"
        "fd = os.open(src, os.O_PATH)\n"
        "r._bind(fd, dst, True)\n"
        "print(r._mounts_below(dst) == [dst + '/a sub'])\n"
        "for p in (dst + '/x', dst + '/a sub/x', src + '/a sub/x'):\n"
        "    try:\n"
        "        open(p, 'w').close()\n"
        "        print('wrote')\n"
        "    except OSError as e:\n"
        "        print(e.strerror)\n"
    )
    out = subprocess.run(
        ["unshare", "--mount", sys.executable, "-I", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # The bound copy is read-only, submount included; the source stays writable.
    assert out.stdout.splitlines() == ["True", *["Read-only file system"] * 2, "wrote"]
