"""Reading and writing RL records (JSONL, JSON, Parquet), offline.

Files are read directly (json / pyarrow) by default: exact row numbers for
error messages, and no Arrow schema unification of heterogeneous nested
fields (tool parameters differ per call). `backend="datasets"` reads through
`datasets.load_dataset("json" | "parquet", data_files=...)` instead (same
records; rows numbered over the concatenated files).

A bad record raises RecordError naming the file, the row and the field.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from gdpo_jax.data.files import (  # noqa: F401 - resolve_files, glob helpers re-exported
    PathLike,
    file_ext,
    glob_data_files,
    is_glob,
    resolve_files,
)


class RecordError(ValueError):
    """A malformed record: `path`, `row` (0-based) and `field` say where."""

    def __init__(self, path: str, row: int | None, field: str | None, problem: str):
        self.path, self.row, self.field = path, row, field
        where = path + (f", row {row}" if row is not None else "")
        where += f", field {field!r}" if field else ""
        super().__init__(f"{where}: {problem}")


def iter_records(
    path: PathLike | Sequence[PathLike], *, split: str | None = None, backend: str = "auto"
) -> Iterator[tuple[str, int, dict]]:
    """Yields (file, row, record) for every record of every resolved file."""
    if backend not in ("auto", "datasets"):
        raise ValueError(f"backend must be 'auto' or 'datasets', got {backend!r}")
    files = resolve_files(path, split)
    if backend == "datasets":
        yield from _iter_datasets(files)
        return
    for f in files:
        if file_ext(f) == ".parquet":
            import pyarrow.parquet as pq

            try:
                rows = pq.read_table(f).to_pylist()
            except Exception as e:  # noqa: BLE001 - any pyarrow error: say which file
                raise RecordError(f, None, None, f"cannot read parquet: {e}") from e
            for i, r in enumerate(rows):
                yield f, i, r
        elif file_ext(f) == ".jsonl":
            try:  # utf-8-sig: a leading byte-order mark (Windows editors) is not data
                with open(f, encoding="utf-8-sig") as fh:
                    for i, line in enumerate(fh):
                        if line.strip():
                            yield f, i, _loads(line, f, i)
            except UnicodeDecodeError as e:
                raise _decode_error(f, per_line=True) from e
        else:
            try:
                with open(f, encoding="utf-8-sig") as fh:
                    text = fh.read()
            except UnicodeDecodeError as e:
                raise _decode_error(f, per_line=False) from e
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                # JSON Lines saved as .json: its first line is a JSON value by itself. A
                # broken (pretty-printed) document is reported where it broke instead.
                if not _first_line_parses(text):
                    raise RecordError(
                        f,
                        None,
                        None,
                        f"invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})",
                    ) from e
                # "\n" only: str.splitlines() would also split at U+2028 / U+0085 inside
                # strings, which write_jsonl keeps raw.
                for i, line in enumerate(text.split("\n")):
                    if line.strip():
                        yield f, i, _loads(line, f, i)
                continue
            if isinstance(data, Mapping):
                data = [data]
            if not isinstance(data, list):
                raise RecordError(
                    f, None, None, "a .json data file must hold a record or a list of records"
                )
            escaped = _ESCAPED_SURROGATE in text.lower()
            for i, r in enumerate(data):
                r = _check_mapping(r, f, i)
                if escaped:
                    _check_surrogates(r, f, i)
                yield f, i, r


def _iter_datasets(files: list[str]) -> Iterator[tuple[str, int, dict]]:
    import datasets

    # One load per run of same-kind files, so records come in the given file order (as
    # with the default backend: the shuffle depends on it).
    for k, run in itertools.groupby(files, key=_datasets_builder):
        fs = list(run)
        ds = datasets.load_dataset(k, data_files=fs, split="train")
        label = fs[0] if len(fs) == 1 else f"{fs[0]} (+{len(fs) - 1} files)"
        for i, r in enumerate(ds):
            yield label, i, dict(r)


def _datasets_builder(f: str) -> str:
    return "parquet" if file_ext(f) == ".parquet" else "json"


def _first_line_parses(text: str) -> bool:
    line = next((ln for ln in text.split("\n") if ln.strip()), "")
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def _decode_error(path: str, *, per_line: bool) -> RecordError:
    """RecordError for a file that is not UTF-8, at the first line that fails to decode
    (0-based; the row of a .jsonl file, a line of a .json file)."""
    with open(path, "rb") as fh:
        for i, raw in enumerate(fh):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                problem = (
                    f"not UTF-8 text (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the "
                    "line); re-save the file as UTF-8"
                )
                if per_line:
                    return RecordError(path, i, None, problem)
                return RecordError(path, None, None, f"line {i + 1}: {problem}")
    return RecordError(path, None, None, "not UTF-8 text; re-save the file as UTF-8")


def _loads(line: str, path: str, row: int) -> dict:
    try:
        r = _check_mapping(json.loads(line), path, row)
    except json.JSONDecodeError as e:
        raise RecordError(path, row, None, f"invalid JSON ({e.msg} at column {e.colno})") from e
    if _ESCAPED_SURROGATE in line.lower():
        _check_surrogates(r, path, row)
    return r


# A lone UTF-16 surrogate can only come from a \uXXXX escape (UTF-8 text cannot hold
# one), so records whose text has none skip the check.
_ESCAPED_SURROGATE = "\\ud"


def _check_surrogates(r: dict, path: str, row: int) -> None:
    """RecordError for a record holding a lone UTF-16 surrogate ("\\ud83d", half an
    emoji cut by a scraper): json.loads takes it, then hashing and tokenizing the
    record failed after the model build, naming no record."""
    try:
        json.dumps(r, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError(
            path,
            row,
            None,
            f"holds a lone UTF-16 surrogate (\\u{ord(e.object[e.start]):04x}, half of a "
            "character); remove it or re-save the text as valid UTF-8",
        ) from None


def _check_mapping(r: Any, path: str, row: int) -> dict:
    if not isinstance(r, Mapping):
        raise RecordError(
            path, row, None, f"a record must be a JSON object, got {type(r).__name__}"
        )
    return dict(r)


def get_field(record: Mapping, dotted: str, path: str, row: int, *, default: Any = KeyError) -> Any:
    """record["a"]["b"] for dotted "a.b"; RecordError naming the field if missing."""
    cur: Any = record
    for part in dotted.split("."):
        if isinstance(cur, Mapping) and part in cur and cur[part] is not None:
            cur = cur[part]
        elif default is not KeyError:
            return default
        else:
            raise RecordError(
                path,
                row,
                dotted,
                "missing (keys present: "
                f"{sorted(cur) if isinstance(cur, Mapping) else type(cur).__name__})",
            )
    return cur


def normalize_messages(value: Any, path: str, row: int, field: str = "prompt") -> list[dict]:
    """Chat messages [{"role", "content"}, ...] from a list, an array, JSON text or plain text."""
    if isinstance(value, str):
        s = value.strip()
        if not (s.startswith("[") and s.endswith("]")):
            return [{"role": "user", "content": value}]
        try:
            parsed = json.loads(s)
        except json.JSONDecodeError:
            return [{"role": "user", "content": value}]
        # A JSON list of objects is a message list (checked below); any other list
        # ("[1, 2, 3]", "[]", '["a"]') is a plain-text prompt that looks like JSON.
        if not parsed or not all(isinstance(m, Mapping) for m in parsed):
            return [{"role": "user", "content": value}]
        value = parsed
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        raise RecordError(
            path, row, field, f"expected a non-empty list of chat messages, got {value!r:.80}"
        )
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise RecordError(path, row, f"{field}[{j}]", "each message needs 'role' and 'content'")
        if not isinstance(m["content"], str):
            raise RecordError(
                path, row, f"{field}[{j}].content", "message content must be a string"
            )
        out.append({"role": str(m["role"]), "content": m["content"]})
    return out


def write_jsonl(records: Iterable[Mapping], path: PathLike) -> str:
    """Writes one JSON object per line (UTF-8, non-ASCII kept); returns the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def write_parquet(records: Sequence[Mapping], path: PathLike) -> str:
    """Writes records as a Parquet table (schema inferred by pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    pq.write_table(pa.Table.from_pylist([dict(r) for r in records]), path)
    return path


def write_records(records: Sequence[Mapping], path: PathLike) -> str:
    """write_jsonl or write_parquet by the file extension."""
    p = os.fspath(path)
    if p.endswith(".parquet"):
        return write_parquet(records, p)
    if p.endswith(".jsonl"):
        return write_jsonl(records, p)
    raise ValueError(f"{p}: write .jsonl or .parquet")


def samples_dir() -> str:
    """Directory of the small shipped sample files (gdpo_jax/data/samples)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples")


def sample_path(name: str) -> str:
    """Path of a shipped sample file, e.g. sample_path("toolcall_verl.jsonl")."""
    p = os.path.join(samples_dir(), name)
    if not os.path.exists(p):
        raise FileNotFoundError(
            f"no shipped sample {name!r}; available: {sorted(os.listdir(samples_dir()))}"
        )
    return p
