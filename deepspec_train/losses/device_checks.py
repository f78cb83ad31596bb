"""Value checks that never stop a GPU stream: a condition computed on the tensors' device is asserted there.

Reading a device tensor into Python (``bool(t)``, ``int(t)``, ``t.item()``) waits for every kernel queued before it;
a check of input values per micro-batch would then cost one such wait each. ``require`` asserts the condition
asynchronously on an accelerator (a failed check surfaces as a device-side assert at the next sync) and at once on
CPU, where nothing is queued: the CPU case raises ``ValueError`` with the message, as a host check would.
"""

from __future__ import annotations

import torch


def require(condition: torch.Tensor, message: str) -> None:
    """Fail with ``message`` unless the boolean scalar ``condition`` holds, without a host sync on a device."""
    if condition.device.type != "cpu":
        torch._assert_async(condition, message)
        return
    try:
        torch._assert_async(condition, message)
    except RuntimeError:
        raise ValueError(message) from None
