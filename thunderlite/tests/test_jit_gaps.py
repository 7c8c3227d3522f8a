"""thunderlite.jit front-door gaps: closure-cell writes (``nonlocal``) replayed by
the epilogue, and torch.autocast regions; ground truth is eager (issue 4)."""
from __future__ import annotations

import pytest
import torch

import thunderlite


def _counter():
    n = 0
    acc = torch.zeros(3)

    def step(x):
        nonlocal n, acc
        n += 1
        acc = acc + x * n
        return acc.sum()
    return step


@pytest.mark.filterwarnings("ignore:thunderlite recompiled")
def test_nonlocal_python_and_tensor_writes_replayed_every_call():
    eager, jitted_src = _counter(), _counter()
    jf = thunderlite.jit(jitted_src)
    for i in range(4):
        x = torch.full((3,), float(i + 1))
        torch.testing.assert_close(jf(x), eager(x))
    cells_e = [c.cell_contents for c in eager.__closure__]
    cells_j = [c.cell_contents for c in jitted_src.__closure__]
    for a, b in zip(cells_e, cells_j, strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(b, a)
        else:
            assert a == b == 4


def _tensor_accumulator():
    acc = torch.zeros(2, 2)

    def add(x):
        nonlocal acc
        acc = acc + x
        return acc * 2
    return add


def test_nonlocal_tensor_write_hits_cache_and_uses_run_outputs():
    eager, src = _tensor_accumulator(), _tensor_accumulator()
    jf = thunderlite.jit(src)
    for _ in range(3):
        x = torch.randn(2, 2)
        torch.testing.assert_close(jf(x), eager(x))
    torch.testing.assert_close(src.__closure__[0].cell_contents, eager.__closure__[0].cell_contents)
    info = thunderlite.cache_info(jf)
    assert (info["hits"], info["misses"]) == (2, 1)


def _reader_writer():
    scale = 1.0

    def bump():
        nonlocal scale
        scale = scale * 3.0

    def f(x):
        bump()
        y = x * scale           # reads the overlay: the value written by bump
        return y
    return f


def test_nonlocal_write_seen_by_later_reads_in_the_same_call():
    eager, src = _reader_writer(), _reader_writer()
    jf = thunderlite.jit(src)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(jf(x), eager(x))
    # the cell's value lives in bump's closure
    assert src.__closure__[0].cell_contents.__closure__[0].cell_contents == 27.0


def _deleter():
    tmp = torch.ones(2)

    def f(x):
        nonlocal tmp
        y = x + tmp
        del tmp
        return y
    return f


def test_nonlocal_delete_replayed():
    src = _deleter()
    jf = thunderlite.jit(src)
    x = torch.randn(2)
    torch.testing.assert_close(jf(x), x + 1)
    with pytest.raises(ValueError):
        src.__closure__[0].cell_contents


def test_cells_created_inside_the_call_stay_native():
    def f(x):
        total = x * 0

        def add(v):
            nonlocal total
            total = total + v

        for k in range(3):
            add(x * k)
        return total

    jf = thunderlite.jit(f)
    x = torch.randn(5)
    torch.testing.assert_close(jf(x), f(x))
    torch.testing.assert_close(jf(x + 1), f(x + 1))
