"""Run directories that may be URLs (gs://, s3://, ...), and the input paths a config names.

A workdir such as `gs://bucket/run` goes through `etils.epath` (as in
big_vision and MaxText): metrics, config.json, plots and TensorBoard events
are written to the URL and Orbax writes checkpoints there itself. It is never
treated as a local relative path (which would create `./gs:/bucket/run`).
Whether the filesystem package for the scheme is installed is checked in
config validation, before any work starts.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Any

# URL scheme -> the fsspec package etils.epath needs for it.
FS_PACKAGES = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}


def is_url(path: str) -> bool:
    return "://" in str(path)


def join(base: str, *parts: str) -> str:
    """os.path.join that keeps a URL's `scheme://` intact."""
    if is_url(base):
        return "/".join([str(base).rstrip("/"), *parts])
    return os.path.join(base, *parts)


def _epath(path: str) -> Any:
    from etils import epath

    return epath.Path(path)


def exists(path: str) -> bool:
    return _epath(path).exists() if is_url(path) else os.path.exists(path)


def makedirs(path: str) -> None:
    if is_url(path):
        _epath(path).mkdir(parents=True, exist_ok=True)
    else:
        os.makedirs(path, exist_ok=True)


def move(src: str, dst: str) -> None:
    """Moves a file or a directory tree (a URL through etils.epath's rename)."""
    if is_url(src):
        _epath(src).rename(dst)
    else:
        shutil.move(src, dst)


@contextlib.contextmanager
def open_file(path: str, mode: str = "r") -> Iterator[IO]:
    """open() for local paths and URLs alike (URLs: no append mode, see `LocalMirror`)."""
    if is_url(path):
        with _epath(path).open(mode) as f:
            yield f
    else:
        with open(path, mode) as f:
            yield f


def check_workdir(path: str, field: str = "workdir") -> None:
    """Raises ConfigError when `path` is a local file, or a URL whose filesystem package
    is missing."""
    from gdpo_jax.errors import ConfigError

    if not is_url(path):
        check_output(path, f"config.{field}", is_dir=True)
        return
    scheme = str(path).split("://", 1)[0]
    if scheme not in FS_PACKAGES:
        raise ConfigError(
            f"config.{field}={path!r}: unsupported URL scheme {scheme!r}; use a local "
            f"directory or one of {', '.join(s + '://' for s in FS_PACKAGES)}."
        )
    package = FS_PACKAGES[scheme]
    has_tf = importlib.util.find_spec("tensorflow") is not None  # epath's other backend
    if not has_tf and importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"config.{field}={path!r} needs the {package} package to write to {scheme}:// "
            f"(pip install {package}); or use a local directory."
        )


def check_output(path: str, name: str, *, is_dir: bool) -> None:
    """Raises ConfigError (naming `name`, the flag or field) when a local output `path`
    cannot be written: a file where a directory is wanted or the reverse, an existing
    one that is not writable, or a file (or an unwritable directory) where one of its
    missing parents would go. Tools
    call it before their work, so a typo in an output path does not cost a run.
    URLs are left to their writer; missing parents are for the writer to create."""
    from gdpo_jax.errors import ConfigError

    if not path or is_url(path):
        return
    if str(path).startswith("~"):
        # The shell expands "~" only at the start of a word, not after "--flag=": the
        # run wrote into a folder named "~" under the current directory while its logs
        # named ~/..., and removing that folder by hand risks the home directory.
        raise ConfigError(
            f"{name}={path!r} starts with '~', which the shell does not expand after '='; "
            f"write the full path, e.g. {name}={os.path.expanduser(path)}."
        )
    full = os.path.abspath(path)
    if os.path.exists(full):
        if is_dir != os.path.isdir(full):
            want, found = ("directory", "a file") if is_dir else ("file", "a directory")
            raise ConfigError(f"{name}={path!r} is {found}, not a {want}; choose another path.")
        # A read-only mount or another user's directory (access() reports EROFS too).
        if not os.access(full, os.W_OK | (os.X_OK if is_dir else 0)):
            raise ConfigError(f"{name}={path!r} is not writable; choose another path.")
        return
    parent = os.path.dirname(full)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(
            f"{name}={path!r}: {parent!r} is a file, so nothing can be written under it; "
            "choose another path."
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}={path!r}: {parent!r} is not writable; choose another path.")


def check_inputs(cfg: Any, *, data: bool = True) -> None:
    """Raises ConfigError when the model or data paths the config names do not exist.

    Checked in validation so that a typo fails in a second, not after the build.
    Registered model names and "synthetic" data are not paths; URLs are left to
    the loader. data=False: the model's path only (a run given its task's records).
    """
    from gdpo_jax.data.files import glob_data_files, is_glob
    from gdpo_jax.errors import ConfigError

    name = str(cfg.model.get("name", ""))
    if name and not is_url(name):
        from gdpo_jax.models import gguf

        gguf_path = name.lower().endswith(".gguf")  # a .GGUF file is one too
        if gguf_path and not os.path.isfile(name):
            raise ConfigError(f"config.model.name={name!r}: no such .gguf file.")
        if not gguf_path and name.lower() not in gguf.KNOWN_MODELS:
            if not os.path.isdir(name):
                raise ConfigError(
                    f"config.model.name={name!r} is not a directory (relative to "
                    f"{os.getcwd()}) nor a known offline model {sorted(gguf.KNOWN_MODELS)}; "
                    "fetch the checkpoint first (`hf download <repo> --local-dir DIR`)."
                )
            if not os.path.isfile(os.path.join(name, "config.json")):
                raise ConfigError(
                    f"config.model.name={name!r} has no config.json: not a Hugging Face "
                    "checkpoint directory."
                )
            if not glob.glob(os.path.join(name, "*.safetensors")):
                raise ConfigError(
                    f"config.model.name={name!r} holds no *.safetensors weights (the loader "
                    "reads safetensors only); convert or download the weights there."
                )
            _check_model_type(name)
    for field in ("source", "eval_source") if data else ():
        src = str(cfg.task.get(field, ""))
        if not src or src == "synthetic" or is_url(src) or os.path.exists(src):
            continue  # an existing path is a path, even with glob characters (`set[1]/`)
        files, skipped = glob_data_files(src) if is_glob(src) else ([], [])
        if not files:
            what = "no .jsonl/.json/.parquet file" if skipped else "no file or directory"
            raise ConfigError(
                f"config.task.{field}={src!r} matches {what} (relative to {os.getcwd()})"
                + (f"; skipped, not data files: {skipped[:5]}" if skipped else "")
                + "; give a path, glob or directory, or 'synthetic'."
            )


def _check_model_type(name: str) -> None:
    """ConfigError when the checkpoint's config.json names an architecture the loader does
    not build (it failed in the build, with a traceback)."""
    import json

    from gdpo_jax.errors import ConfigError
    from gdpo_jax.models.config import SUPPORTED_MODEL_TYPES

    try:
        with open(os.path.join(name, "config.json")) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(
            f"config.model.name={name!r}: its config.json does not read as a JSON object "
            f"({type(e).__name__}); fetch the checkpoint again."
        ) from None
    if model_type not in SUPPORTED_MODEL_TYPES:
        what = f"is a {model_type!r} checkpoint" if model_type else "names no model_type"
        raise ConfigError(
            f"config.model.name={name!r} {what}; the loader builds "
            f"{sorted(SUPPORTED_MODEL_TYPES)} (docs/models.md); choose such a checkpoint."
        )


class LocalMirror:
    """A local staging directory that is copied to a URL workdir on `sync()`.

    Object stores have no append mode, and TensorBoard's writer wants a local
    file: writers write here, and `sync()` uploads every file (whole) to
    `remote`. Files already at `remote` (a resumed run) are downloaded first.
    """

    def __init__(self, remote: str, files: tuple[str, ...] = ()):
        self.remote = remote
        self.local = tempfile.mkdtemp(prefix="gdpo_workdir_")
        for name in files:
            src = join(remote, name)
            if exists(src):
                with open_file(src, "rb") as f, open(os.path.join(self.local, name), "wb") as g:
                    shutil.copyfileobj(f, g)

    def sync(self) -> None:
        for root, _, names in os.walk(self.local):
            rel = os.path.relpath(root, self.local)
            target = self.remote if rel == "." else join(self.remote, *rel.split(os.sep))
            makedirs(target)
            for n in names:
                with open(os.path.join(root, n), "rb") as f, open_file(join(target, n), "wb") as g:
                    shutil.copyfileobj(f, g)

    def close(self) -> None:
        self.sync()
        shutil.rmtree(self.local, ignore_errors=True)
