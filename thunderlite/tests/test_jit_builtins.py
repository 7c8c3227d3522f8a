"""Torch C functions without a symbol, reached from jitted code."""
import torch

import thunderlite


def test_torch_function_that_creates_a_tensor_runs_on_every_call():
    """A torch C function without a symbol that makes a tensor from Python values is
    recorded (opaque), not run once at trace time with its result baked in."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jitted = thunderlite.jit(lambda: torch.range(0, 3))
        first = jitted()
        first.add_(10)
        second = jitted()
    torch.testing.assert_close(second, torch.arange(4, dtype=torch.float32))
    assert second.data_ptr() != first.data_ptr()
    window = thunderlite.jit(lambda x: x + torch.kaiser_window(4))
    torch.testing.assert_close(window(torch.zeros(4)), torch.kaiser_window(4))
