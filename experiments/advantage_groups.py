r"""Distinct advantage groups per estimator (the GDPO paper's Fig. 2-3 analysis).

For binary rewards, enumerate every multiset of G rollouts with K rewards,
apply each estimator through ``gdpo_jax.core.compute_advantages`` (all
multisets of one (G, K) in one call, one group per multiset) and count the
distinct sorted advantage vectors. Two sweeps: K = 2 with G = 2..max_g, and
G = 4 with K = 1..max_k.

  python -m experiments.advantage_groups --out_dir=runs/advantage_groups

Writes ``counts.json`` and ``advantage_groups.png`` to --out_dir and prints a
table. With K = 2, G = 2: GRPO 2, GDPO 3.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags, logging

from gdpo_jax.analysis import distinct_advantage_counts, num_multisets
from gdpo_jax.core.advantages import ESTIMATORS
from gdpo_jax.train import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined on launch, not on import, so tests and other entry points that
    import ``run`` never collide with their own flags of the same name."""
    flags.DEFINE_string(
        "out_dir", "runs/advantage_groups", "Where to write counts.json and the PNG."
    )
    flags.DEFINE_integer("max_g", 8, "Largest G in the K-fixed sweep (G = 2..max_g).")
    flags.DEFINE_integer("max_k", 5, "Largest K in the G-fixed sweep (K = 1..max_k).")
    flags.DEFINE_integer("fixed_k", 2, "K held fixed in the G sweep (paper: 2).")
    flags.DEFINE_integer("fixed_g", 4, "G held fixed in the K sweep (paper: 4).")


LABELS = {
    "grpo": "GRPO",
    "grpo_no_std": "GRPO w/o std",
    "gdpo": "GDPO",
    "gdpo_no_bn": "GDPO w/o batch norm",
}


def sweep(pairs: list[tuple[int, int]]) -> list[dict]:
    """Counts for each (G, K) in ``pairs``: rows of {G, K, multisets, seconds, <estimator>: n}."""
    rows = []
    for g, k in pairs:
        t0 = time.perf_counter()
        counts = distinct_advantage_counts(g, k, ESTIMATORS)
        rows.append(
            {
                "G": g,
                "K": k,
                "multisets": num_multisets(g, k),
                "seconds": round(time.perf_counter() - t0, 3),
                **counts,
            }
        )
    return rows


def format_table(title: str, rows: list[dict]) -> str:
    head = ["G", "K", "multisets"] + [LABELS[e] for e in ESTIMATORS]
    body = [
        [str(r["G"]), str(r["K"]), str(r["multisets"])] + [str(r[e]) for e in ESTIMATORS]
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([title, line(head), line(["-" * w for w in widths])] + [line(b) for b in body])


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = [
        ("by_g", "G", f"K = {result['fixed_k']} rewards: vary rollouts G"),
        ("by_k", "K", f"G = {result['fixed_g']} rollouts: vary rewards K"),
    ]
    for ax, (key, var, title) in zip(axes, panels):
        rows = result[key]
        xs = [r[var] for r in rows]
        for e, marker in zip(ESTIMATORS, "osD^"):
            # GDPO's batch whitening is affine, so "w/o batch norm" coincides: dashed on top.
            style = dict(linestyle="--", markersize=4) if e == "gdpo_no_bn" else {}
            ax.plot(xs, [r[e] for r in rows], marker=marker, label=LABELS[e], **style)
        values = [r[e] for r in rows for e in ESTIMATORS]
        if max(values) >= 20 * min(values):  # log only where the range calls for it
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(xs)
        ax.set_xlabel(var)
        ax.set_ylabel("# distinct advantage groups")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend()
    fig.suptitle("Distinct advantage groups over all binary-reward multisets")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(out_dir: str, max_g: int = 8, max_k: int = 5, fixed_k: int = 2, fixed_g: int = 4) -> dict:
    """Runs both sweeps, prints the tables, writes counts.json and the PNG; returns the result."""
    if max_g < 2 or max_k < 1 or fixed_g < 2 or fixed_k < 1:
        raise ValueError("need max_g >= 2, max_k >= 1, fixed_g >= 2, fixed_k >= 1.")
    result = {
        "fixed_k": fixed_k,
        "fixed_g": fixed_g,
        "estimators": list(ESTIMATORS),
        "by_g": sweep([(g, fixed_k) for g in range(2, max_g + 1)]),
        "by_k": sweep([(fixed_g, k) for k in range(1, max_k + 1)]),
    }
    print(format_table(f"Distinct advantage groups, K = {fixed_k}", result["by_g"]))
    print()
    print(format_table(f"Distinct advantage groups, G = {fixed_g}", result["by_k"]))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "counts.json"), "w") as f:
        json.dump(result, f, indent=2)
    plot(result, os.path.join(out_dir, "advantage_groups.png"))
    print(f"\nwrote {out_dir}/counts.json and {out_dir}/advantage_groups.png")
    return result


def main(argv: list[str]) -> None:
    from gdpo_jax.errors import ConfigError
    from gdpo_jax.train.paths import check_output

    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    if not FLAGS["verbosity"].present:  # keep the table readable (no backend INFO lines)
        logging.set_verbosity(logging.WARNING)

    for flag, low in (("max_g", 2), ("max_k", 1), ("fixed_g", 2), ("fixed_k", 1)):
        if FLAGS[flag].value < low:
            cli.fail(f"--{flag}={FLAGS[flag].value} must be >= {low}.")
    try:
        check_output(FLAGS.out_dir, "--out_dir", is_dir=True)  # before the sweep
    except ConfigError as e:
        cli.fail(e)
    run(FLAGS.out_dir, FLAGS.max_g, FLAGS.max_k, FLAGS.fixed_k, FLAGS.fixed_g)


if __name__ == "__main__":
    define_flags()
    app.run(main, flags_parser=cli.flags_parser(()))  # one-line errors, exit 2
