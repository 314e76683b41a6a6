"""tests/_hlo.py: custom calls read from HLO text, not its metadata."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tests._hlo import custom_call_targets


def test_a_function_named_after_a_kernel_is_not_a_call_to_it():
    # A module that calls no custom call but whose stack-frame table names a function
    # ..._through_cudnn_...: the substring check the attention tests made matched it
    # (test_prompt_sharing's cuDNN test failed after test_scale_plan's in one process).
    def loss_through_cudnn_on_a_gpu_target(x):
        return jnp.sum(jnp.sin(x))

    text = jax.jit(loss_through_cudnn_on_a_gpu_target).lower(jnp.ones(4)).compile().as_text()
    assert "cudnn" in text  # the name is in the metadata
    assert custom_call_targets(text) == []


def test_custom_call_targets_in_order():
    text = (
        '%a = f32[2] custom-call(f32[2] %p), custom_call_target="__cudnn$fmhaSoftmax"\n'
        '%b = f32[2] custom-call(f32[2] %a), custom_call_target="tpu_custom_call", '
        'metadata={op_name="tpu_custom_call_of_cudnn"}\n'
    )
    assert custom_call_targets(text) == ["__cudnn$fmhaSoftmax", "tpu_custom_call"]
