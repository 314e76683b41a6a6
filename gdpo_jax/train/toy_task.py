"""Moved: the toy task lives in `gdpo_jax.tasks.toy`. This name re-exports it."""

from gdpo_jax.tasks.toy import (  # noqa: F401
    ARGS,
    FILLER,
    SPECIALS,
    TOOLS,
    WORDS,
    correct_reward,
    evaluate,
    format_reward,
    length_reward,
    load,
    make_tokenizer,
    records,
)
