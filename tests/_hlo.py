"""What a compiled program calls, read from its HLO text.

A marker searched for in the whole text (`"cudnn" in compiled.as_text()`) also
matches the text's metadata: JAX writes the Python function names of every traced
frame into the module (its stack-frame tables), and a test named
`..._through_cudnn_...` traced earlier in the same process put "cudnn" into a
module that called no cuDNN kernel. Tests look at the custom calls' targets instead.
"""

from __future__ import annotations

import re

__all__ = ["custom_call_targets"]

_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def custom_call_targets(hlo_text: str) -> list[str]:
    """The `custom_call_target` of every custom call in `hlo_text`, in order."""
    return _TARGET.findall(hlo_text)
