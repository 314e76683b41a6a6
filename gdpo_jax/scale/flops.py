"""Analytic FLOPs of one RL step and a roofline estimate of its time.

XLA's `cost_analysis()` counts a `scan` / `while` body once (and is
unimplemented on GPU), so the step's FLOPs are counted here by hand, per phase,
with every row running to `max_new_tokens` (the worst case the memory plan is
also made for). Notation: L layers, d hidden, f MLP width, q = Hq * Dh,
kv = Hkv * Dh, V vocab, P prompt width, C completion width, T = P + C.

  matmul FLOPs per token, forward:   m = 2 * L * (d * (q + 2 kv) + q * d + 3 d f)
  unembedding per predicted token:   u = 2 * d * V
  attention at context length s:     a(s) = 4 * L * q * s   (QK^T and AV)

  sampling (per call):  prefill U prompts: U * (P m + u + a(P) * (P + 1) / 2)
                        decode B rows:     B * (C (m + u) + 4 L q (C P + C (C + 1) / 2))
                        ... in phases:     B * (C (m + u) + 4 L q C (P + sum_j c_j E_j / C))
                                           (a phase's steps attend over all its slots)
  log-prob pass:        N * (T m + C u + a(T) * (T + 1) / 2)        (causal attention)
  ... prompts shared:   N / S * (P m + a(P) (P + 1) / 2)             (algo.share_prompt: each
                        + N * (C (m + u) + 4 L q (C P + C (C + 1) / 2))  prompt once per S = G rows)
  training:             E * (3 + remat) * log-prob pass FLOPs       (fwd + 2x bwd [+ fwd again])

The roofline time of a phase is max(FLOPs / (n * peak), bytes / HBM bw), bytes
per device, summed over phases (n devices). Bytes: decode streams the whole weight matrix
(FSDP all-gathers it) and the rows' KV cache once per step (the whole cache of
the step's decode phase: phase j of `decode_chunks` c_0..c_{K-1} reads
P + E_j slots, E_j = c_0 + ... + c_j, at every step, the slots
no token has reached yet too; a row's own-slot reads average sum_j c_j E_j / C
per step, 5/8 C with 4 equal phases, C with one), the weights in the
dtype the decode form reads (`StepShape.decode_param_bytes`: the storage dtype
under the layer scan; the unrolled forms read a compute-dtype copy, made once
per call, which also costs one read and one write of the weights per call);
the other phases are compute bound at these sizes and count their weight reads
per micro-batch. Communication, host work (rewards, tokenizing)
and kernel efficiency are left out: it is a lower bound on the step time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gdpo_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The sizes of one RL step that FLOPs depend on."""

    rows: int  # N = num_prompts * group_size
    prompts: int  # num_prompts
    rows_per_call: int  # sampler rows per generate call
    prompt_len: int  # P
    new_tokens: int  # C
    logprob_passes: int  # recompute old + reference (0..2)
    epochs: int
    remat: bool
    micro_batches: int  # per step: epochs * minibatches * microbatches
    param_bytes: int  # storage bytes of the whole model (all devices)
    kv_bytes_per_token: int  # one token of one row, all layers, k and v
    # Rows reading one prompt's KV cache: G when shared; lanes / W for continuous
    # batching's W shared prompt slots (sampling.continuous_prompt_slots).
    prompt_share: float = 1
    train_prompt_share: int = 1  # rows per prompt forward in the step / log-prob pass
    # Bytes of the weights one sampler step reads (prefill and decode): the
    # unrolled decode forms' compute-dtype copy (sampling.decode.weights_in),
    # made once per call. None: param_bytes (the scan reads the stored weights).
    decode_param_bytes: int | None = None
    # The decode's phases (DecodeSpec.chunks, summing to new_tokens); () reads
    # and attends over only the slots filled so far (C / 2 own slots per step on
    # average).
    decode_chunks: tuple[int, ...] = ()


def _matmul_flops(mc: ModelConfig) -> float:
    d, f = mc.hidden_size, mc.intermediate_size
    q, kv = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    return 2.0 * mc.num_layers * (d * (q + 2 * kv) + q * d + 3 * d * f)


def own_slots_per_step(new_tokens: int, chunks: tuple[int, ...] = ()) -> float:
    """A row's own (completion) KV slots one decode step reads, averaged over the
    `new_tokens` steps: sum_j c_j E_j / C over the phases (module docstring);
    C / 2 with no phases given (only the filled slots)."""
    if not chunks:
        return new_tokens / 2
    ends = np.cumsum(chunks)
    return float(np.dot(chunks, ends) / max(new_tokens, 1))


def _attn(mc: ModelConfig) -> float:
    return 4.0 * mc.num_layers * mc.num_heads * mc.head_dim


def step_flops(mc: ModelConfig, s: StepShape) -> dict[str, float]:
    """FLOPs per RL step by phase: prefill, decode, logprob, train, total."""
    m, u, a = _matmul_flops(mc), 2.0 * mc.hidden_size * mc.vocab_size, _attn(mc)
    P, C = s.prompt_len, s.new_tokens
    T = P + C
    prefill = s.prompts * (P * m + u + a * P * (P + 1) / 2)
    # A phased decode computes attention over its phase's every slot (masked or
    # not: own_slots_per_step), an unphased count over the filled ones.
    own = C * own_slots_per_step(C, s.decode_chunks) if s.decode_chunks else C * (C + 1) / 2
    decode = s.rows * (C * (m + u) + a * (C * P + own))
    if s.train_prompt_share > 1:  # each prompt once, its rows' completions over it
        prompts = s.rows / s.train_prompt_share
        one_pass = prompts * (P * m + a * P * (P + 1) / 2) + s.rows * (
            C * (m + u) + a * (C * P + C * (C + 1) / 2)
        )
    else:
        one_pass = s.rows * (T * m + C * u + a * T * (T + 1) / 2)
    logprob = s.logprob_passes * one_pass
    train = s.epochs * (3 + int(s.remat)) * one_pass
    out = dict(prefill=prefill, decode=decode, logprob=logprob, train=train)
    out["total"] = float(sum(out.values()))
    return out


def roofline(
    mc: ModelConfig, s: StepShape, *, num_devices: int, peak_flops: float, hbm_bw: float
) -> dict[str, float]:
    """Seconds per phase and in total (see the module docstring for the formula)."""
    fl = step_flops(mc, s)
    n = num_devices
    compute = {k: fl[k] / (n * peak_flops) for k in ("prefill", "decode", "logprob", "train")}
    calls = -(-s.rows // s.rows_per_call)
    # Decode: every step of every call reads all weights (per device, gathered) and
    # the call's KV cache shard (P + the phase's own slots; a prompt's slots once
    # per prompt_share rows when its cache is shared).
    kv_step = (
        s.rows_per_call
        / n
        * s.kv_bytes_per_token
        * (s.prompt_len / s.prompt_share + own_slots_per_step(s.new_tokens, s.decode_chunks))
    )
    read = s.param_bytes if s.decode_param_bytes is None else s.decode_param_bytes
    copy = 0 if s.decode_param_bytes is None else s.param_bytes + s.decode_param_bytes
    decode_bytes = calls * (copy + s.new_tokens * (read + kv_step))
    passes = s.micro_batches * (3 + int(s.remat))  # weight reads of the training passes
    mem = {
        "prefill": calls * read / hbm_bw,
        "decode": decode_bytes / hbm_bw,
        # A log-prob pass runs its U x M micro-batches once per step, not per epoch.
        "logprob": s.logprob_passes * (s.micro_batches // s.epochs) * s.param_bytes / hbm_bw,
        "train": passes * s.param_bytes / hbm_bw,
    }
    out = {k: float(max(compute[k], mem[k])) for k in compute}
    out["total"] = float(np.sum(list(out.values())))
    out["bound"] = {k: ("memory" if mem[k] > compute[k] else "compute") for k in compute}
    return out
