"""Analytic FLOPs of one RL step and a roofline estimate of its time.

XLA's `cost_analysis()` counts a `scan` / `while` body once (and is
unimplemented on GPU), so the step's FLOPs are counted here by hand, per phase,
with every row running to `max_new_tokens` (the worst case the memory plan is
also made for). Notation: L layers, d hidden, f MLP width, q = Hq * Dh,
kv = Hkv * Dh, V vocab, P prompt width, C completion width, T = P + C;
B rows_per_call as configured, S batch shards (data x fsdp), B' = ceil(B / S) S
the rows a call decodes (the sampler pads them to the shards), N / B calls.

  matmul FLOPs per token, forward:   m = 2 * L * (d * (q + 2 kv) + q * d + 3 d f)
  unembedding per predicted token:   u = 2 * d * V
  attention at context length s:     a(s) = 4 * L * q * s   (QK^T and AV)

  sampling (per call):  prefill U prompts: U * (P m + u + a(P) * (P + 1) / 2)
                        decode B' rows:    B' * (C (m + u) + 4 L q (C P + C (C + 1) / 2))
                        ... in phases:     B' * (C (m + u) + 4 L q C (P + sum_j c_j E_j / C))
                                           (a phase's steps attend over all its slots)
                        ... continuous, l lanes per shard, r = ceil(B' / S / l) rounds:
                            l S * (r C (m + u) + 4 L q (C (P + sum_j c_j E_j / C)
                                                        + (r - 1) C (P + C)))
                            (later rounds run in the last phase: all P + C slots)
  log-prob pass:        N * (T m + C' u + a(T) * (T + 1) / 2)       (causal attention)
  ... prompts shared:   N / G * (P m + a(P) (P + 1) / 2)             (algo.share_prompt: each
                        + N * (C m + C' u + 4 L q (C P + C (C + 1) / 2))   prompt once per G rows)
  training:             E * (3 pass + recompute + chunked * N C' u)
                        (forward + 2x backward; model.remat re-runs in the backward the
                        layers' forward with remat_policy "full" (`layers`: the pass less
                        its unembedding N C' u), their attention dots alone with
                        "dots" (recompute = the pass's a(.) terms: the weight products'
                        outputs are kept); "full" re-runs every weight product but the
                        down projection, whose output nothing in the backward reads
                        (recompute = `layers` less 2 L d f per token); a chunked
                        log-prob, algo.logprob_chunk_size = c > 0, re-runs each chunk's
                        unembedding in the backward, whether or not the layers are
                        rematerialized)
  C' = C, or the c-position chunks' ceil(C / c) c (the last chunk padded).

The roofline time of a phase is max(FLOPs / (n * peak), bytes / HBM bw), bytes
per device, summed over phases (n devices). Bytes: decode streams the weights
(FSDP all-gathers them; each device reads its "tensor" shard, 1 / tp of them,
except continuous batching on several devices, which gathers them whole) and
the rows' KV cache (B' / S rows per device, kv heads split over "tensor" when
they divide) once per step (the whole cache of the step's decode phase: phase j
of `decode_chunks` c_0..c_{K-1} reads P + E_j slots, E_j = c_0 + ... + c_j, at
every step, the slots no token has reached yet too; a row's own-slot reads
average sum_j c_j E_j / C per step, 5/8 C with 4 equal phases, C with one), the
weights in the dtype the decode form reads (`StepShape.decode_param_bytes`: the
storage dtype under the layer scan; the unrolled forms read a compute-dtype
copy, made once per call, which also costs one read and one write of the
weights per call); the other phases are compute bound at these sizes and count
their weight reads (1 / tp of them per device) per micro-batch. Continuous batching
with fewer lanes than a shard's rows decodes r rounds of C steps: the weights r times, and
in rounds after the first all P + C slots per step. Communication,
host work (rewards, tokenizing) and kernel efficiency are left out: it is a
lower bound on the step time.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.sharding import AbstractMesh

from gdpo_jax.models.config import ModelConfig
from gdpo_jax.sharding import sanitize_spec


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The sizes of one RL step that FLOPs depend on."""

    rows: int  # N = num_prompts * group_size
    prompts: int  # num_prompts
    rows_per_call: int  # B: sampler rows per generate call, as configured (N / B calls)
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
    # The mesh's batch shards (data x fsdp): each call decodes rows_per_call rows
    # padded up to a multiple of them (`call_rows`).
    batch_shards: int = 1
    # The mesh's "tensor" size: a device reads 1 / tensor of the (gathered) weights.
    tensor: int = 1
    # Continuous batching on several devices: every device gathers the whole weights
    # (each kv head too) once per call, so the sampler reads them whole.
    sampler_weights_whole: bool = False
    logprob_chunk_size: int = 0  # algo.logprob_chunk_size (0: the whole completion at once)
    # model.remat_policy (read with remat): "full" re-runs the layers in the backward,
    # "dots" only their attention dots (ModelConfig.remat_policy).
    remat_policy: str = "full"
    # Continuous batching's lanes per batch shard (sampling.continuous_slots, at most a
    # call's rows per shard); 0: the static decode, every row of a call at once.
    decode_lanes: int = 0

    @property
    def decode_rows(self) -> int:
        """The rows one decode step computes over all shards: the call's, or its lanes."""
        return self.decode_lanes * self.batch_shards if self.decode_lanes else self.call_rows

    @property
    def decode_rounds(self) -> int:
        """C-step rounds of one call's decode: a shard's rows `decode_lanes` at a time
        (every row running to max_new_tokens); 1 for the static decode."""
        if not self.decode_lanes:
            return 1
        return -(-(self.call_rows // self.batch_shards) // self.decode_lanes)

    @property
    def calls(self) -> int:
        """Sampler calls per step: N / B."""
        return -(-self.rows // self.rows_per_call)

    @property
    def call_rows(self) -> int:
        """B': the rows one call decodes, padded to the batch shards."""
        return -(-self.rows_per_call // self.batch_shards) * self.batch_shards

    @property
    def unembed_positions(self) -> int:
        """C': the positions a log-prob pass unembeds per row (chunks padded)."""
        c = min(self.logprob_chunk_size, self.new_tokens) if self.logprob_chunk_size else 0
        return -(-self.new_tokens // c) * c if c else self.new_tokens


def kv_head_shards(num_kv_heads: int, tensor: int) -> int:
    """Devices the KV cache's heads split over on a "tensor" axis of `tensor`: the
    cache's own rule (`sanitize_spec` on its heads dim, as `Transformer.init_cache`
    lays it out and the sampler keeps it), so `tensor` where it divides the heads,
    else 1 (every device holds every head)."""
    mesh = AbstractMesh((tensor,), ("tensor",))
    return tensor if sanitize_spec(("tensor",), (num_kv_heads,), mesh)[0] else 1


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
    P, C, Cu = s.prompt_len, s.new_tokens, s.unembed_positions
    T = P + C
    prefill = s.prompts * (P * m + u + a * P * (P + 1) / 2)
    # A phased decode computes attention over its phase's every slot (masked or
    # not: own_slots_per_step), an unphased count over the filled ones.
    own = C * own_slots_per_step(C, s.decode_chunks) if s.decode_chunks else C * (C + 1) / 2
    # Every call decodes its padded rows (the batch-padding rows run every step too);
    # continuous batching's later rounds run in the last phase, over all P + C slots.
    r = s.decode_rounds
    attend = C * P + own + (r - 1) * C * (P + C)
    decode = s.calls * s.decode_rows * (r * C * (m + u) + a * attend)
    if s.train_prompt_share > 1:  # each prompt once, its rows' completions over it
        prompts = s.rows / s.train_prompt_share
        tokens = prompts * P + s.rows * C
        attention = a * (prompts * P * (P + 1) / 2 + s.rows * (C * P + C * (C + 1) / 2))
    else:
        tokens, attention = s.rows * T, s.rows * a * T * (T + 1) / 2
    layers = tokens * m + attention
    unembed = s.rows * Cu * u
    one_pass = layers + unembed
    logprob = s.logprob_passes * one_pass
    # Forward + backward (2x); remat re-runs the layers' forward but the down projection,
    # whose output no backward rule reads (with the "dots" policy only their attention
    # dots); a chunked log-prob each chunk's unembedding (jax.checkpoint of its body).
    down = tokens * 2.0 * mc.num_layers * mc.hidden_size * mc.intermediate_size
    rerun = layers - down if s.remat_policy == "full" else attention
    recompute = int(s.remat) * rerun + int(s.logprob_chunk_size > 0) * unembed
    train = s.epochs * (3 * one_pass + recompute)
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
    calls = s.calls
    # Decode: every step of every call reads the weights (per device: gathered over
    # fsdp, its 1 / tp of them over "tensor") and the call's KV cache shard (its
    # padded rows over the batch shards, the kv heads over "tensor"; P + the phase's
    # own slots; a prompt's slots once per prompt_share rows when its cache is shared).
    tp = 1 if s.sampler_weights_whole else s.tensor
    kv_tp = kv_head_shards(mc.num_kv_heads, tp)
    kv_row = s.decode_rows / (s.batch_shards * kv_tp) * s.kv_bytes_per_token
    prompt = s.prompt_len / s.prompt_share
    kv_step = kv_row * (prompt + own_slots_per_step(s.new_tokens, s.decode_chunks))
    stored = s.param_bytes / s.tensor  # one device's share of the gathered weights
    read = (s.param_bytes if s.decode_param_bytes is None else s.decode_param_bytes) / tp
    copy = 0 if s.decode_param_bytes is None else (s.param_bytes + s.decode_param_bytes) / tp
    # Continuous batching with fewer lanes than rows: each further round of C steps reads
    # the weights again, and all P + C slots (the last phase runs until the work is done).
    later = (s.decode_rounds - 1) * s.new_tokens * (read + kv_row * (prompt + s.new_tokens))
    decode_bytes = calls * (copy + s.new_tokens * (read + kv_step) + later)
    # Weight reads of the training passes: a "dots" remat re-runs no weight product.
    passes = s.micro_batches * (3 + int(s.remat and s.remat_policy == "full"))
    mem = {
        "prefill": calls * read / hbm_bw,
        "decode": decode_bytes / hbm_bw,
        # A log-prob pass runs its U x M micro-batches once per step, not per epoch.
        "logprob": s.logprob_passes * (s.micro_batches // s.epochs) * stored / hbm_bw,
        "train": passes * stored / hbm_bw,
    }
    out = {k: float(max(compute[k], mem[k])) for k in compute}
    out["total"] = float(np.sum(list(out.values())))
    out["bound"] = {k: ("memory" if mem[k] > compute[k] else "compute") for k in compute}
    return out
