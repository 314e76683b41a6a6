"""Shared command-line plumbing: one-line errors (exit 2), config paths, `--config.*` overrides.

Every mistake on the command line (a misspelled field, a value of the wrong
type, a missing config file, a field that fails validation) is printed as ONE
line naming the flag or field, and the process exits with status 2 before any
work starts:

    error: --config.algo.estimater: no such config field. Did you mean "estimator" \
    instead of "estimater"?

`--config=configs/x.py` is resolved relative to the caller's directory; when
no such file exists there, relative to the project's installed `configs`
package (so the console scripts work from any directory).
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

EXIT_USAGE = 2
# A run stopped by a preemption notice after saving: what a shell reports for a process
# SIGTERM ended (128 + 15), so a scheduler or wrapper reads "terminated", never "done".
EXIT_PREEMPTED = 143


def fail(message: Any) -> NoReturn:
    """Prints `error: <message>` as one line on stderr and exits with status 2."""
    _error_line(message)
    sys.exit(EXIT_USAGE)


def fail_run(message: Any) -> NoReturn:
    """`fail`'s one line, with exit status 1: the run started and stopped on a condition
    it names (a diverged update), not a usage error."""
    _error_line(message)
    sys.exit(1)


def stop_preempted(message: Any) -> NoReturn:
    """Prints `stopped: <message>` as one line on stderr and exits with status 143: the
    run saved the step it finished after a SIGTERM (`train/preemption.py`)."""
    _error_line(message, prefix="stopped")
    sys.exit(EXIT_PREEMPTED)


def _error_line(message: Any, *, prefix: str = "error") -> None:
    text = " ".join(str(message).split())
    print(f"{prefix}: {text}", file=sys.stderr)


def configs_dir() -> str | None:
    """Directory of the project's `configs` package (None when it is not importable)."""
    import importlib.util

    spec = importlib.util.find_spec("configs")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def resolve_config_path(value: str) -> str:
    """`configs/x.py[:arg]` -> an existing file: caller-relative first, then the package's."""
    path, sep, arg = value.partition(":")
    if os.path.exists(path):
        # Configs import each other as `configs.<name>`: the directory above a
        # `configs` folder must be importable.
        parent = os.path.dirname(os.path.dirname(os.path.abspath(path)))
        if os.path.basename(os.path.dirname(os.path.abspath(path))) == "configs":
            if parent not in sys.path:
                sys.path.insert(0, parent)
        return value
    pkg = configs_dir()
    if pkg is not None and not os.path.isabs(path):
        parts = path.replace(os.sep, "/").split("/")
        rel = parts[1:] if parts[0] == "configs" else parts
        candidate = os.path.join(pkg, *rel)
        if os.path.exists(candidate):
            return candidate + sep + arg
    fail(
        f"--config={value}: no such file {path!r} (relative to {os.getcwd()})"
        + (f" nor in the installed configs ({pkg})" if pkg else "")
        + "."
    )


def _rewrite_config_args(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """`--config=<path>` and `--config <path>` (absl takes both) with the path resolved
    (the space form skipped the installed configs)."""
    out: list[str] = []
    args = iter(argv)
    for a in args:
        name = next((n for n in names if a == f"--{n}" or a.startswith(f"--{n}=")), None)
        if name is None:
            out.append(a)
        elif a == f"--{name}":  # the space form, as the = form from here on
            value = next(args, None)
            out += [a] if value is None else [f"--{name}=" + resolve_config_path(value)]
        else:
            out.append(f"--{name}=" + resolve_config_path(a.split("=", 1)[1]))
    return out


def _explain(exc: BaseException, argv: Sequence[str]) -> str:
    """One line for an exception raised while parsing flags (absl / ml_collections)."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if isinstance(exc, (KeyError, AttributeError)):  # repr-quoted: "'\'key\'\nDid you mean..."
        text = text.strip("'\"").replace("\\n", " ").replace("\\'", "'")
    missing = re.match(r"'?([A-Za-z_][\w]*)'?\s*(Did you mean.*)?$", " ".join(text.split()), re.S)
    if isinstance(exc, (KeyError, AttributeError)) and missing:
        key, hint = missing.group(1), missing.group(2) or ""
        for a in argv:
            flag = a.split("=", 1)[0]
            if flag.startswith("--") and "." in flag and flag.rsplit(".", 1)[-1] == key:
                return f"{flag}: no such config field. {hint}".strip()
        return f"no such config field {key!r}. {hint}".strip()
    if "Traceback (most recent call last)" in text:  # get_config() raised: its last line
        head = text.split("Error whilst parsing config file")[0].split("Traceback")[0].strip()
        return f"{head} {[x for x in text.splitlines() if x.strip()][-1].strip()}"
    if "Failed loading config file" in text:
        return "could not load the config file: " + " ".join(text.split("\n")[1:])
    return text


def flags_parser(config_flags: Sequence[str] = ("config",)) -> Callable[[list[str]], list[str]]:
    """An `app.run(..., flags_parser=)` whose errors are one line and exit status 2."""

    def parse(argv: list[str]) -> list[str]:
        from absl import flags

        argv = _rewrite_config_args(argv, config_flags)
        try:
            rest = flags.FLAGS(argv)
        except SystemExit:
            raise
        except Exception as e:  # any parse error comes from the user's input
            cause = e.__cause__ or e
            fail(_explain(cause, argv))
        for name in config_flags:
            _check_override_forms(argv, name, flags.FLAGS[name].value)
        return rest

    return parse


def _config_file_values(argv: Sequence[str], name: str) -> Any:
    """The config `--<name>=<file>[:arg]` gives before any override (None if unknown)."""
    import importlib.util

    spec = next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), None)
    if spec is None:
        return None
    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("_gdpo_config_defaults", path)
    try:
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module.get_config(arg) if arg else module.get_config()
    except Exception:  # noqa: BLE001 - the flag parser loaded it already; no check then
        return None


def _check_override_forms(argv: Sequence[str], name: str, cfg: Any) -> None:
    """Two override forms the config parser takes without a word, each refused in one
    line: `a,b` for a tuple of strings (one string "a,b", where `1,2` is two numbers:
    a stop string that never matched), and a dict for a group that has fields (it
    replaced the group: `--config.model.tiny={'num_layers': 2}` lost the other sizes)."""
    default: Any = None  # the config file's own values, loaded only for a dict override
    for a in argv:
        if not a.startswith(f"--{name}.") or "=" not in a:
            continue
        path, raw = a[len(name) + 3 :].split("=", 1)
        if raw.lstrip().startswith("{") and default is None:
            default = _config_file_values(argv, name)
        value, before = cfg, default
        for part in path.split("."):
            value = value.get(part) if hasattr(value, "get") else None
            before = before.get(part) if hasattr(before, "get") else None
        flag = f"--{name}.{path}"
        if isinstance(value, tuple) and len(value) == 1 and value[0] == raw and "," in raw:
            parts = ", ".join(repr(x) for x in raw.split(","))
            fail(
                f"{flag}={raw} is read as one string {raw!r}; for several strings write a "
                f'tuple: {flag}="({parts},)".'
            )
        if raw.lstrip().startswith("{") and hasattr(before, "keys") and len(before):
            fail(
                f"{flag}={raw}: a dict replaces the whole group, and its other fields are lost; "
                f"set each field instead: {flag}.<field>=<value>."
            )


def define_log_level() -> None:
    from absl import flags

    from gdpo_jax.train.logs import LEVELS

    if "log_level" not in flags.FLAGS:
        flags.DEFINE_enum(
            "log_level",
            "info",
            list(LEVELS),
            "Level of the project's own logs; third-party libraries (absl, Orbax, JAX) log at "
            "WARNING unless this is 'debug'.",
        )


def run_config_main(
    main: Callable[[list[str]], None], config_help: str = "Path to a configs/*.py file."
) -> None:
    """Runs `main` as a command line with a required ``--config`` file (and its
    ``--config.*`` overrides, ``--log_level``), errors as one line.

    Re-executes first with the CPU malloc tunable (`gdpo_jax.hostenv`: read at
    process start, so before JAX starts). The config flag is defined here, not at
    import, so several entry points can be imported into one process.
    """
    from absl import app, flags
    from ml_collections import config_flags

    from gdpo_jax.hostenv import relaunch_with_cpu_tunables

    relaunch_with_cpu_tunables()  # before JAX starts: huge pages for XLA:CPU buffers
    config_flags.DEFINE_config_file("config", None, config_help, lock_config=True)
    define_log_level()
    flags.mark_flag_as_required("config")

    def main_with_logging(argv: list[str]) -> None:
        from gdpo_jax.train import logs

        # Here for every entry point: tune_microbatches and check_plan defined
        # --log_level and never applied it.
        logs.setup_logging(flags.FLAGS.log_level)
        main(argv)

    app.run(main_with_logging, flags_parser=flags_parser(("config",)))


# ------------------------------------------------- overrides parsed by hand
def split_overrides(
    argv: Sequence[str], prefixes: Sequence[str]
) -> tuple[list[str], dict[str, list[tuple[str, str]]]]:
    """Takes `--<prefix>.a.b=value` arguments out of argv (for tools that load configs themselves).

    Returns (the remaining argv, prefix -> [(dotted field, value string), ...]).
    """
    rest: list[str] = []
    found: dict[str, list[tuple[str, str]]] = {p: [] for p in prefixes}
    for a in argv:
        for p in prefixes:
            if a.startswith(f"--{p}."):
                field, eq, value = a[len(p) + 3 :].partition("=")
                if not eq:
                    fail(f"{a}: expected --{p}.<field>=<value>.")
                found[p].append((field, value))
                break
        else:
            rest.append(a)
    return rest, found


def apply_overrides(cfg: Any, overrides: Sequence[tuple[str, str]], flag: str = "--config") -> Any:
    """Sets each dotted field of `cfg` from its command-line string, typed like the field.

    Raises ConfigError naming the flag: unknown field (with a suggestion),
    unparsable value, a value for a whole group.
    """
    from ml_collections import ConfigDict

    from gdpo_jax.train.config import ConfigError

    for dotted, value in overrides:
        node, name = cfg, f"{flag}.{dotted}"
        parts = dotted.split(".")
        leaf = parts[-1]
        for i, part in enumerate(parts):
            if not isinstance(node, ConfigDict) or part not in node:
                keys = list(node.keys()) if isinstance(node, ConfigDict) else []
                close = difflib.get_close_matches(part, keys, n=1)
                hint = f' Did you mean "{close[0]}"?' if close else ""
                raise ConfigError(f"{name}: no such config field.{hint}")
            if i < len(parts) - 1:
                node = node[part]
        like = node[leaf]
        if isinstance(like, ConfigDict):
            raise ConfigError(f"{name} is a group of fields; set {name}.<field>=... instead.")
        try:
            node[leaf] = parse_value(value, like)
        except (ValueError, SyntaxError, TypeError) as e:
            raise ConfigError(
                f"{name}={value}: expected a {type(like).__name__} like {like!r} ({e})."
            ) from None
    return cfg


def parse_value(value: str, like: Any) -> Any:
    """A command-line string as the type of the field it overrides (as config_flags does)."""
    if isinstance(like, str):
        return value
    if isinstance(like, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError("not a bool: use True or False")
        return value.lower() in ("true", "1")
    if isinstance(like, (tuple, list)):
        parsed = ast.literal_eval(value)
        return tuple(parsed) if isinstance(parsed, (tuple, list)) else (parsed,)
    if isinstance(like, int):
        return int(value)
    if isinstance(like, float):
        return float(value)
    if like is None:
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return type(like)(value)
