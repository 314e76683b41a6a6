"""A word-level toy tool-calling task that a randomly initialised policy can learn by RL.

The paper's tool-calling rewards give a random policy no signal at all (the
format needs an exact tag structure), so the tiny CPU config trains on this
miniature instead: the request names a tool and two arguments, e.g.

    prompt:  "please weather paris oslo now"     ideal completion: "weather paris oslo"

with three rewards that a random 40-word policy already hits sometimes:
  toy_format  {0,1}  the first word is a tool name;
  toy_correct [0,1]  mean of (first word is the requested tool, arg 1 and arg 2 each
                     among the next two words);
  toy_length  {0,1}  the completion has at most `max_words` words (stopped early).
Learning it takes copying words out of the prompt (attention), picking the
tool slot, and stopping: visibly improving curves in a few hundred small steps.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from gdpo_jax.data.tokenizer_registry import register_tokenizer
from gdpo_jax.rewards.registry import register_reward
from gdpo_jax.tasks.registry import Kwarg, TaskData, register_task

TOOLS = ("weather", "currency", "alarm", "message", "flights", "stock", "translate", "music")
ARGS = (
    "paris",
    "rome",
    "oslo",
    "tokyo",
    "lima",
    "cairo",
    "delhi",
    "berlin",
    "ana",
    "ben",
    "chen",
    "dora",
    "eli",
    "fay",
    "gus",
    "ivy",
    "usd",
    "eur",
    "gbp",
    "jpy",
    "work",
    "gym",
    "adele",
    "queen",
)
FILLER = ("please", "now", "the", "and", "for", "me", "a", "to")
SPECIALS = ("<pad>", "<s>", "</s>")
WORDS = SPECIALS + TOOLS + ARGS + FILLER

# config.task.kwargs of toy_toolcall and three_binary: `records`' options. The upper
# bounds are the word lists' sizes (more was quietly the whole list); a request needs
# one tool (0 tools divided by zero) and two different arguments.
KWARGS = (
    Kwarg("filler", float, 0.5, 0, 1, means="chance of a filler word before, and after, a request"),
    Kwarg("num_tools", int, len(TOOLS), 1, len(TOOLS), means="tool words the requests use"),
    Kwarg("num_args", int, len(ARGS), 2, len(ARGS), means="argument words; a request takes two"),
)


@register_tokenizer("toy_words")
def make_tokenizer() -> Any:
    """Word-level HF tokenizer over WORDS (<pad>=0, <s>=1 prepended, </s>=2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<pad>",
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.padding_side = "left"
    return fast


def records(
    n: int,
    *,
    seed: int,
    split: str,
    filler: float = 0.5,
    num_tools: int = len(TOOLS),
    num_args: int = len(ARGS),
) -> list[dict]:
    """n requests; the test split never repeats a train (tool, arg1, arg2) triple.

    Held out per ordered triple: toy_correct takes the two arguments in either order,
    and most test requests (0.91 at the default sizes) are a train request with its
    arguments swapped, so the held-out eval measures copying words into new slots,
    not unseen argument pairs.

    filler: probability of a filler word before (and, independently, after)
    the request; 0 gives fixed positions (the easiest copy).
    """
    r = random.Random(f"toy-{seed}")
    args = ARGS[:num_args]
    pool = [(t, a, b) for t in TOOLS[:num_tools] for a in args for b in args if a != b]
    r.shuffle(pool)
    held = pool[: max(len(pool) // 10, 1)]
    source = held if split == "test" else pool[len(held) :]
    rs = random.Random(f"toy-{seed}-{split}")
    out = []
    for i in range(n):
        tool, a, b = source[i % len(source)]
        words = [tool, a, b]
        if rs.random() < filler:
            words.insert(0, rs.choice(FILLER))
        if rs.random() < filler:
            words.append(rs.choice(FILLER))
        out.append(
            {"prompt": " ".join(words), "tool": tool, "args": [a, b], "target": f"{tool} {a} {b}"}
        )
    return out


@register_reward("toy_format")
def format_reward(prompts: Sequence, completions: Sequence[str], **kw) -> list[float]:
    return [float(bool(c.split()) and c.split()[0] in TOOLS) for c in completions]


@register_reward("toy_correct")
def correct_reward(
    prompts: Sequence,
    completions: Sequence[str],
    *,
    tool: Sequence[str],
    args: Sequence[Sequence[str]],
    **kw,
) -> list[float]:
    out = []
    for c, t, a in zip(completions, tool, args):
        w = c.split()
        # Arguments count only in the two slots after the tool (either order),
        # so padding the answer with extra words earns nothing.
        hits = [bool(w) and w[0] == t] + [x in w[1:3] for x in a]
        out.append(float(np.mean(hits)))
    return out


@register_reward("toy_length")
def length_reward(
    prompts: Sequence, completions: Sequence[str], *, max_words: int = 4, **kw
) -> list[float]:
    return [float(len(c.split()) <= max_words) for c in completions]


def evaluate(completions: Sequence[str], examples: Sequence[dict], **kw) -> dict[str, float]:
    """exact: share of completions equal to "tool arg1 arg2"; plus the three rewards' means."""
    tools = [e["tool"] for e in examples]
    args = [e["args"] for e in examples]
    return {
        "exact": float(
            np.mean([" ".join(c.split()) == e["target"] for c, e in zip(completions, examples)])
        ),
        "format": float(np.mean(format_reward(None, completions))),
        "correct": float(np.mean(correct_reward(None, completions, tool=tools, args=args))),
        "length": float(np.mean(length_reward(None, completions))),
    }


@register_task("toy_toolcall", kwargs=KWARGS, synthetic_only=True)
def load(cfg) -> TaskData:
    t = cfg.task
    kw = t.kwargs.to_dict()
    return TaskData(
        train=records(t.num_train, seed=t.seed, split="train", **kw),
        eval=records(t.num_eval, seed=t.seed, split="test", **kw),
        evaluate=evaluate,
    )
