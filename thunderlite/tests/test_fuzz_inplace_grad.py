"""The jit in-place fuzzer (test_fuzz_inplace_jit.py) with arguments that
require grad: the same random programs of views, writes, reads, state in
globals/closures/modules, no-grad regions, custom ops and autograd.Functions,
over non-leaf arguments that may share storage, so writes into the arguments
and into views of them are on a gradient path (autodiff functionalizes them,
or runs eager mode with the reason named). The program's state tensor may also
be a leaf requiring grad (a module's parameter): eager refuses writes into it
outside no-grad regions, so the generator keeps those under ``torch.no_grad()``.
Every call is compared with eager: outputs and their ``requires_grad``, the
arguments and the state after the call, and the gradients of the leaves behind
them, from a loss over the outputs, the arguments and the state (whose history
continues from the program's). Where eager's backward raises (a saved tensor
was written), the gradients are not compared. Values are compared with
``rtol=1e-4``: on a gradient path composites such as ``addcmul`` run as their
decomposition, whose rounding differs from the fused kernel's by an ulp, and
the programs chain ``exp`` enough to amplify it.

``scripts/fuzz_inplace.py --grad --seeds N [--executors torchcompile,torch]``
runs many seeds."""
from __future__ import annotations

import warnings

import pytest
import torch

import thunderlite
from thunderlite.executors.registry import get_executor
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion, failure, generate


def _grads(outputs, args, leaves):
    """The leaves' gradients of a weighted sum of the outputs and arguments that
    require grad (None where unreached), or the error eager's backward raised."""
    try:
        terms = [t.sum() * (i + 1) for i, t in enumerate(list(outputs) + list(args))
                 if isinstance(t, torch.Tensor) and t.requires_grad]
        if not terms:
            return (None,) * len(leaves)
        return torch.autograd.grad(sum(terms), leaves, allow_unused=True)
    except RuntimeError as err:
        return err


_TOL = {"rtol": 1e-4, "atol": 1e-5, "equal_nan": True}


def _values(x):
    """Tensors detached (a view eager invalidated raises when compared as is)."""
    return tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in x)


def _flags(outputs) -> list:
    return [t.requires_grad for t in outputs if isinstance(t, torch.Tensor)]


def check_seed(seed: int, executors=None) -> None:
    """Every call of the program (each with its own aliasing between arguments
    and state) through one jitted function equals eager: outputs and their
    ``requires_grad``, arguments, base and state afterwards, gradients."""
    prog = generate(seed, grad=True)
    for exs in ([None, [ShuffleFusion(seed), "torch"]] if executors is None else [executors]):
        ref_fn, fn = prog.function(), prog.function()
        jfn = thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)
        for call in range(len(prog.calls)):
            try:
                _check_call(prog, call, ref_fn, fn, jfn)
            except Exception as err:  # noqa: BLE001 - any failure becomes the seed's report
                raise AssertionError(failure(prog, exs, call, err, jfn, "grad, ")) from None


def _check_call(prog, call: int, ref_fn, fn, jfn) -> None:
    ref_leaves: list = []
    (ra, rb), ref_base = prog.make_args(ref_leaves, call, ref_fn)
    leaves: list = []
    (a, b), base = prog.make_args(leaves, call, fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = ref_fn(ra, rb)
        ref_state = _state(prog, ref_fn)
        ref_grads = _grads(expected, (ra, rb) + ref_state, ref_leaves)
        got = jfn(a, b)
        state = _state(prog, fn)
        torch.testing.assert_close(_values(got), _values(expected), **_TOL)
        assert _flags(got) == _flags(expected), f"requires_grad {_flags(got)}, eager {_flags(expected)}"
        torch.testing.assert_close(_values((a, b) + state), _values((ra, rb) + ref_state), **_TOL)
        assert _flags((a, b) + state) == _flags((ra, rb) + ref_state), "requires_grad of the inputs differs"
        if base is not None:
            torch.testing.assert_close(base.detach(), ref_base.detach(), **_TOL)
        grads = _grads(got, (a, b) + state, leaves)
        if not isinstance(ref_grads, Exception):
            assert not isinstance(grads, Exception), f"backward raised where eager's did not: {grads}"
            torch.testing.assert_close(grads, ref_grads, **_TOL)


def _state(prog, fn) -> tuple:
    state = prog.state(fn)
    return () if state is None else (state,)


@pytest.mark.parametrize("chunk", range(4))
def test_fuzz_inplace_grad(chunk):
    for seed in range(chunk * 25, (chunk + 1) * 25):
        check_seed(seed)


@pytest.mark.parametrize("seed", [47, 144, 153, 163, 207])
def test_eager_mode_torchcompile_regions_save_what_eager_saves(seed):
    """Seeds whose programs run in eager mode with torchcompile regions: a region
    autograd records runs as its torch calls (executors/torchcompile.py,
    EagerWhenRecording), so a later write into a tensor a compiled graph would
    have saved does not raise eager's "modified by an inplace operation" where
    eager does not (each of these raised it before)."""
    ok, reason = get_executor("torchcompile").is_available()
    if not ok:
        pytest.skip(f"torchcompile executor unavailable: {reason}")
    check_seed(seed, executors=["torchcompile", "torch"])


def test_torchcompile_regions_do_not_return_detached_aliases_as_views():
    """Seed 2873: ``r3 = Fn.apply(w); r3.detach().add_(a)`` with ``a`` requiring
    grad. A compiled region returning ``r3`` and its ``detach()`` gave the alias
    back as a view of ``r3`` (AOTAutograd regenerates aliased outputs from their
    base), so the write made ``r3`` require grad where eager's does not;
    untracked aliases now stay outside torchcompile regions."""
    ok, reason = get_executor("torchcompile").is_available()
    if not ok:
        pytest.skip(f"torchcompile executor unavailable: {reason}")
    check_seed(2873, executors=["torchcompile", "torch"])


@pytest.mark.parametrize("seed", [4283, 5033])
def test_seeds_that_raised_where_eager_did_not(seed):
    """4283: a mutating custom op with no autograd formula whose own outputs no
    loss reaches (its backward was called on zeros and raised); 5033: a write
    into ``w[:, ::2].reshape(-1)``, a copy in eager, refused as a view of a leaf."""
    check_seed(seed)
