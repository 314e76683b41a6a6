"""Finding data files: a file, a glob, a directory's split files (named as Hugging Face
`datasets` names them), or a list of these, each file once."""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Sequence

__all__ = ["PathLike", "file_ext", "glob_data_files", "is_data_file", "is_glob", "resolve_files"]

_EXTS = (".jsonl", ".json", ".parquet")
PathLike = str | os.PathLike
log = logging.getLogger(__name__)

# A directory's split files are named as in Hugging Face `datasets` (data_files.py): the
# split's name is a word of a file's name or of a directory's name above it (`train.jsonl`,
# `train-00000-of-00002.parquet`, `train.part0.jsonl`, `my_train_v2.json`, `train/0.jsonl`,
# `data-train/a.jsonl`), a word being bounded by the name's ends or these characters
# (their NON_WORDS_CHARS), or one of the split's other names (their SPLIT_KEYWORDS:
# `training.jsonl`, `dev/`, `eval-00000-of-00001.parquet`). A name that is a word of two
# of these splits is an error.
_WORD_SEP = "-._ 0-9"
_SPLIT_NAMES = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}


def resolve_files(path: PathLike | Sequence[PathLike], split: str | None = None) -> list[str]:
    """Data files for `path`: a file, a glob, a directory, or a list of these.

    For a directory, `split` picks the files whose name, or a directory's name under it,
    holds the split's name as a word (`train.jsonl`, `train-00000-of-00002.parquet`,
    `train.part0.jsonl`, `x_train_y.json`, `train/*.jsonl`) or one of its other names
    (`training`; `valid`, `val`, `dev`; `testing`, `eval`, `evaluation`), sorted by path,
    each file once; under `data/`, as HF dataset repos store them, when none lie at the
    top. Without `split`, every data file at the top (else in `data/`). A list reads a
    file it names twice once, where it first appears.
    """
    if isinstance(path, (list, tuple)):
        return _resolve_list(path, split)
    path = os.fspath(path)
    if os.path.isdir(path):
        for d in (path, os.path.join(path, "data")):
            if not os.path.isdir(d):
                continue
            if split is None:
                files = [os.path.join(d, f) for f in sorted(os.listdir(d)) if is_data_file(f)]
            else:
                files = _split_files(d, split)
            if files:
                return files
        raise FileNotFoundError(
            f"no {'/'.join(_EXTS)} files"
            + (
                f" for split {split!r} (named like {split}.*, {split}-*, *_{split}_*, or in "
                f"a {split}/ directory"
                + (f"; or {', '.join(_SPLIT_NAMES[split][1:])}" if split in _SPLIT_NAMES else "")
                + ")"
                if split
                else ""
            )
            + f" in directory {path} or its data/"
        )
    if not os.path.exists(path) and is_glob(path):  # an existing `set[1]/a.jsonl` is a file
        files, skipped = glob_data_files(path)
        if not files:
            raise FileNotFoundError(
                f"no {'/'.join(_EXTS)} files match {path}"
                + (
                    f" (skipped: {', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''})"
                    if skipped
                    else ""
                )
            )
        return files
    if not os.path.exists(path):
        raise FileNotFoundError(f"data file not found: {path}")
    if not is_data_file(path):
        raise ValueError(f"{path}: unsupported data file type; use one of {_EXTS}")
    return [path]


def _resolve_list(paths: Sequence[PathLike], split: str | None) -> list[str]:
    """resolve_files of each path, in order, each file once: overlapping globs
    (`["data/*.jsonl", "data/train.jsonl"]`) would repeat its records, weighting them twice."""
    out, listed_by = [], {}
    for p in map(os.fspath, paths):
        for f in resolve_files(p, split):
            key = os.path.realpath(f)  # one file under two spellings or links is one file
            if key in listed_by:
                log.warning(
                    "data file %s is listed twice (%s, then %s); its records are read once",
                    f,
                    listed_by[key],
                    p,
                )
                continue
            listed_by[key] = p
            out.append(f)
    return out


def _split_files(root: str, split: str) -> list[str]:
    """The data files of `split` directly in `root` or in its split-named directories
    (at any depth below those), sorted by path; hidden names skipped, as HF does."""
    found = []
    for name in os.listdir(root):
        p = os.path.join(root, name)
        if _hidden(name) or not _names_split(split, name):
            continue
        if os.path.isdir(p):
            files = _data_files_under(p)
        else:
            files = [p] if os.path.isfile(p) and is_data_file(name) else []
        others = [s for s in _SPLIT_NAMES if s != split and _names_split(s, name)]
        if files and others:
            raise ValueError(
                f"{p}: its name matches both split {split!r} and split {others[0]!r}; rename "
                "it to name one split, or give its files instead of the directory"
            )
        found += files
    return _once(sorted(found))


def _once(files: list[str]) -> list[str]:
    """`files` without a second path to a file already listed (two links to one file,
    or a file and a link to it, would weight its records twice)."""
    seen, out = set(), []
    for f in files:
        key = os.path.realpath(f)
        if key in seen:
            log.warning("data file %s is a second path to %s; its records are read once", f, key)
            continue
        seen.add(key)
        out.append(f)
    return out


def _data_files_under(d: str) -> list[str]:
    out = []
    for top, dirs, names in os.walk(d):
        dirs[:] = [n for n in dirs if not _hidden(n)]
        out += [
            os.path.join(top, n)
            for n in names
            if not _hidden(n) and is_data_file(n) and os.path.isfile(os.path.join(top, n))
        ]
    return out


def _names_split(split: str, name: str) -> bool:
    """`name` holds `split` or one of its other names as a word."""
    return any(_is_word(k, name) for k in _SPLIT_NAMES.get(split, (split,)))


def _is_word(word: str, name: str) -> bool:
    return re.search(rf"(?:^|[{_WORD_SEP}]){re.escape(word)}(?:[{_WORD_SEP}]|$)", name) is not None


def _hidden(name: str) -> bool:
    return name.startswith((".", "__"))


def file_ext(path: str) -> str:
    """The extension, lower-case: `train.JSONL` is JSON Lines."""
    return os.path.splitext(path)[1].lower()


def is_data_file(path: str) -> bool:
    return file_ext(path) in _EXTS


def is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def glob_data_files(pattern: str) -> tuple[list[str], list[str]]:
    """(data files, skipped matches) of a glob: regular files with a data extension are
    kept; READMEs, other files and directories are skipped."""
    files, skipped = [], []
    for f in sorted(glob.glob(pattern)):
        (files if os.path.isfile(f) and is_data_file(f) else skipped).append(f)
    return files, skipped
