"""The task's records a run uses: the prompts that fit `sampling.max_prompt_len`.

`usable_records` filters the training and held-out splits by encoded prompt
length and says what the filter changed: a warning for dropped prompts (the
metrics then cover fewer of them); a ConfigError naming the setting when no
training prompt is left, or fewer than the processes that each draw their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import ml_collections as mlc

from gdpo_jax.errors import ConfigError

log = logging.getLogger("gdpo_jax.train")

# Prompts (strings or chat messages) -> their token ids, as the sampler encodes them.
Encode = Callable[[Sequence], list]


def prompt_length_filter(
    records: list[dict], encode: Encode, max_len: int
) -> tuple[list[dict], int]:
    """Drops records whose encoded prompt exceeds `max_len` tokens. Returns (kept, dropped)."""
    kept = [r for r in records if len(encode([r["prompt"]])[0]) <= max_len]
    return kept, len(records) - len(kept)


def usable_records(
    cfg: mlc.ConfigDict, train: list[dict], held_out: list[dict], encode: Encode, processes: int
) -> tuple[list[dict], list[dict], dict[str, int]]:
    """(training records, held-out records, {"train": dropped, "eval": dropped}).

    The held-out records are cut to `train.eval_num_examples` after the filter.
    Raises ConfigError when the training records cannot feed `processes` processes.
    """
    max_len = cfg.sampling.max_prompt_len
    kept, dropped = prompt_length_filter(train, encode, max_len)
    if dropped:
        log.warning(
            "dropped %d training prompts longer than sampling.max_prompt_len=%d", dropped, max_len
        )
    if train and not kept:
        _no_prompt_fits(train, encode, max_len)
    evals, eval_dropped = held_out_records(held_out, encode, max_len, cfg.train.eval_num_examples)
    if len(kept) < processes:
        _too_few_prompts(len(kept), dropped, processes, max_len)
    return kept, evals, {"train": dropped, "eval": eval_dropped}


def held_out_records(
    held_out: list[dict], encode: Encode, max_len: int, limit: int = 0
) -> tuple[list[dict], int]:
    """(the held-out records an eval scores, how many were dropped): those whose prompt
    fits `max_len` tokens, then the first `limit` (0 = all). Every prompt is encoded
    here, on every process: a bad one is an error at start-up, not on one process in
    the eval's collectives (where the others waited for minutes, then aborted)."""
    evals, dropped = prompt_length_filter(held_out, encode, max_len)
    if dropped:
        # Eval metrics then cover a subset of the held-out split: say so, as for training.
        log.warning(
            "dropped %d of %d held-out prompts longer than sampling.max_prompt_len=%d; "
            "eval metrics cover the other %d",
            dropped,
            len(held_out),
            max_len,
            len(evals),
        )
    return (evals[:limit] if limit else evals), dropped


def _no_prompt_fits(train: list[dict], encode: Encode, max_len: int) -> None:
    """Raises the error for a max_prompt_len below every training prompt's length
    (the stream would otherwise fail on 0 records, naming no setting)."""
    ids = encode([r["prompt"] for r in train])
    lo, hi = min(map(len, ids)), max(map(len, ids))
    span, keep_all = (f"{lo} to {hi}", f" ({hi} keeps them all)") if hi > lo else (lo, "")
    raise ConfigError(
        f"config.sampling.max_prompt_len={max_len} leaves no training prompt: "
        f"the task's {len(ids)} prompts are {span} tokens long; set it to at least "
        f"{lo}{keep_all}."
    )


def _too_few_prompts(kept: int, dropped: int, processes: int, max_len: int) -> None:
    """Raises the error for fewer training prompts than processes (each process
    draws its own share of every batch)."""
    cause = (
        f"config.sampling.max_prompt_len={max_len} keeps "
        f"{kept} of the task's {kept + dropped} training prompts"
        if dropped
        else f"config.task has {kept} training prompts"
    )
    raise ConfigError(
        f"{cause}, fewer than the {processes} processes that each draw their own; "
        + ("raise max_prompt_len or " if dropped else "")
        + f"give the task at least {processes} training prompts."
    )
