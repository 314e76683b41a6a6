"""Record files (JSONL / JSON / Parquet), synthetic task generators, tokenizers by name
(`tokenizer_registry`), the trainer's prompt stream (`stream.PromptStream`) and SFT
target corruption (`corrupt`).

from gdpo_jax.data import synthetic, write_records
splits = synthetic.make_splits("toolcall", 2000, 200, seed=0)
"""

from gdpo_jax.data.loaders import (
    RecordError,
    get_field,
    iter_records,
    normalize_messages,
    resolve_files,
    sample_path,
    samples_dir,
    write_jsonl,
    write_parquet,
    write_records,
)

__all__ = [
    "RecordError",
    "get_field",
    "iter_records",
    "normalize_messages",
    "resolve_files",
    "sample_path",
    "samples_dir",
    "write_jsonl",
    "write_parquet",
    "write_records",
]
