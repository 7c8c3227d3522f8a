"""Linear algebra: matmul and its spellings (mm, bmm, mv, dot, linear,
addmm, baddbmm, outer, einsum). All bottom out in ``prims.matmul``;
``linalg.lstsq`` and ``grouped_mm`` (the mixture-of-experts grouped GEMM)
are one torch call each, with their shapes computed here."""
from __future__ import annotations

import builtins

import torch
from torch._subclasses.fake_tensor import FakeTensor

from thunderlite.core import dtypes, prims
from thunderlite.core.prims import check
from thunderlite.core.proxies import DataDependentError, TensorProxy, register_method
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import reductions as red
from thunderlite.torch.ops import shapes
from thunderlite.torch.ops.numbers import is_traced
from thunderlite.torch.registry import decomposable, register_leaf, torchsymbol
from thunderlite.torch.utils import known_equal

T = torch.Tensor


def _same_dtype(a, b, what: str):
    check(a.dtype == b.dtype, lambda: f"{what}: expected both operands to have the same dtype, "
                                      f"but got {a.dtype} and {b.dtype}")


@torchsymbol(torch.matmul, T.matmul, method_name="matmul", operators=("__matmul__",))
def matmul(input, other):
    _same_dtype(input, other, "matmul")
    return prims.matmul(input, other)


register_method("__rmatmul__", ew.reflected(matmul))


@torchsymbol(torch.mm, T.mm, method_name="mm")
def mm(input, mat2):
    check(input.ndim == 2 and mat2.ndim == 2, lambda: "mm: both arguments must be matrices")
    return matmul(input, mat2)


@torchsymbol(torch.bmm, T.bmm, method_name="bmm")
def bmm(input, mat2):
    check(input.ndim == 3 and mat2.ndim == 3, lambda: "bmm: both arguments must be 3-d")
    check(input.shape[0] == mat2.shape[0], lambda: "bmm: batch sizes differ")
    return matmul(input, mat2)


@torchsymbol(torch.mv, T.mv, method_name="mv")
def mv(input, vec):
    check(input.ndim == 2 and vec.ndim == 1, lambda: "mv: expected a matrix and a vector")
    return matmul(input, vec)


@torchsymbol(torch.dot, T.dot, method_name="dot")
def dot(input, other):
    check(input.ndim == 1 and other.ndim == 1, lambda: "1D tensors expected, but got other shapes")
    return matmul(input, other)


@torchsymbol(torch.outer, T.outer, torch.ger, T.ger, method_name=("outer", "ger"))
def outer(input, vec2):
    return ew.mul(shapes.unsqueeze(input, 1), shapes.unsqueeze(vec2, 0))


@torchsymbol(torch.inner, T.inner, method_name="inner")
def inner(input, other):
    if input.ndim == 0 or other.ndim == 0:
        return ew.mul(input, other)
    return matmul(input, shapes.transpose(other, -1, -2) if other.ndim > 1 else other) if other.ndim <= 2 \
        else red.sum(ew.mul(shapes.unsqueeze(input, -2), other), -1)


def _beta_alpha(base, prod, beta, alpha):
    """beta * base + alpha * prod; beta == 0 ignores base entirely (NaNs included),
    decided when the program runs for a traced beta (torch/ops/numbers.py)."""
    scaled = prod if known_equal(alpha, 1) else ew.mul(prod, alpha)
    if is_traced(beta):
        base = shapes.expand(base, prod.shape) if base.shape != prod.shape else base
        keep = ew.ne(prims.full(prod.shape, beta, device=prod.device, dtype=dtypes.result_type(beta)), 0)
        return ew.add(ew.where(keep, ew.mul(base, beta), 0), scaled)
    if beta == 0:
        return scaled
    base = shapes.expand(base, prod.shape) if base.shape != prod.shape else base
    return ew.add(base if known_equal(beta, 1) else ew.mul(base, beta), scaled)


@torchsymbol(torch.nn.functional.linear, torch._C._nn.linear)
def linear(input, weight, bias=None):
    out = matmul(input, shapes.t(weight) if weight.ndim == 2 else weight)
    return out if bias is None else ew.add(out, bias)


@torchsymbol(torch.addmm, T.addmm, method_name="addmm")
def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    return _beta_alpha(input, mm(mat1, mat2), beta, alpha)


@torchsymbol(torch.baddbmm, T.baddbmm, method_name="baddbmm")
def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    return _beta_alpha(input, bmm(batch1, batch2), beta, alpha)


@torchsymbol(torch.addbmm, T.addbmm, method_name="addbmm")
def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    return _beta_alpha(input, red.sum(bmm(batch1, batch2), 0), beta, alpha)


@torchsymbol(torch.addmv, T.addmv, method_name="addmv")
def addmv(input, mat, vec, *, beta=1, alpha=1):
    return _beta_alpha(input, mv(mat, vec), beta, alpha)


@torchsymbol(torch.addr, T.addr, method_name="addr")
def addr(input, vec1, vec2, *, beta=1, alpha=1):
    return _beta_alpha(input, outer(vec1, vec2), beta, alpha)


@torchsymbol(torch.einsum)
def einsum(equation, *operands):
    """Operands are summed out pairwise left to right: each contraction is a
    broadcast multiply + sum over the letters no later operand or the output needs."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    check(len(terms) == len(operands), lambda: "einsum(): more operands were provided than specified in the equation")
    decomposable("." not in eq, lambda: "einsum with '...' is not supported by the decomposition")
    if "->" not in eq:
        counts = {c: lhs.count(c) for c in lhs if c.isalpha()}
        rhs = "".join(sorted(c for c, n in counts.items() if n == 1))
    ops = [_einsum_diag(op, term) for op, term in zip(operands, terms, strict=True)]
    letters, x = ops[0]
    for i in range(1, len(ops)):
        l2, y = ops[i]
        later = set(rhs) | set("".join(o[0] for o in ops[i + 1:]))
        letters, x = _einsum_pair(letters, x, l2, y, later)
    keep = [c for c in letters if c in rhs]
    drop = [letters.index(c) for c in letters if c not in rhs]
    if drop:
        x = red.sum(x, drop)
    return shapes.permute(x, [keep.index(c) for c in rhs]) if keep != list(rhs) else x


def _einsum_diag(x, term: str):
    """Take diagonals for repeated letters within one operand."""
    letters = list(term)
    while len(set(letters)) != len(letters):
        c = next(c for c in letters if letters.count(c) > 1)
        i = letters.index(c)
        j = letters.index(c, i + 1)
        x = shapes.diagonal(x, 0, i, j)
        letters = [letter for k, letter in enumerate(letters) if k not in (i, j)] + [c]
    return "".join(letters), x


def _einsum_pair(la: str, a, lb: str, b, later: set):
    allc = list(dict.fromkeys(la + lb))
    def aligned(letters, x):
        x = shapes.permute(x, sorted(range(len(letters)), key=lambda k: allc.index(letters[k]))) if letters else x
        order = sorted(letters, key=allc.index)
        shape = [x.shape[order.index(c)] if c in order else 1 for c in allc]
        return prims.reshape(x, tuple(shape))
    prod = ew.mul(aligned(la, a), aligned(lb, b))
    drop = [k for k, c in enumerate(allc) if c not in later]
    if drop:
        prod = red.sum(prod, drop)
    return "".join(c for c in allc if c in later), prod


# --- least squares: one torch call, its shapes per ATen's rules (no meta kernel in torch) ----------

_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _lstsq_meta(A, B, rcond=None, *, driver=None):
    """``linalg_lstsq``'s outputs (ATen's ``linalg_lstsq_out_info``): the CPU
    default driver is ``gelsy``; ``rank`` is empty for ``gels``, the singular
    values are kept by ``gelsd``/``gelss`` only; residuals exist for a tall
    ``A`` (m > n) with ``gels`` (full rank assumed), never with ``gelsy``."""
    check(A.ndim >= 2, lambda: "torch.linalg.lstsq: input must have at least 2 dimensions.")
    check(0 <= A.ndim - B.ndim <= 1, lambda: "torch.linalg.lstsq: input.dim() must be greater or equal to "
                                             "other.dim() and (input.dim() - other.dim()) <= 1")
    check(A.dtype == B.dtype, lambda: f"torch.linalg.lstsq: Expected input and other to have the same dtype, "
                                      f"but got input's dtype {A.dtype} and other's dtype {B.dtype}")
    driver = "gelsy" if driver is None else driver
    check(driver in _LSTSQ_DRIVERS, lambda: f"parameter `driver` should be one of {_LSTSQ_DRIVERS}")
    vector = A.ndim - B.ndim == 1
    b_shape = tuple(B.shape) + (1,) if vector else tuple(B.shape)
    (m, n), k = A.shape[-2:], b_shape[-1]
    check(b_shape[-2] == m, lambda: "torch.linalg.lstsq: input.size(-2) should match other.size(-2)")
    batch = tuple(prims.broadcast_shapes(tuple(A.shape[:-2]), b_shape[:-2]))
    check(driver not in ("gelsd", "gelss") or not m > n, lambda: (
        f"torch.linalg.lstsq with driver='{driver}' and more rows than columns: whether residuals are "
        "computed depends on the rank of the input, known only when the program runs; use driver='gels' "
        "or 'gelsy', or call it outside the jitted function"), DataDependentError)
    real = dtypes.to_real(A.dtype)
    grad = A.requires_grad or B.requires_grad
    like = dict(device=A.device)
    solution = TensorProxy(shape=batch + ((n,) if vector else (n, k)), dtype=A.dtype, requires_grad=grad, **like)
    residuals = TensorProxy(shape=batch + (k,) if driver == "gels" and m > n else (0,), dtype=real,
                            requires_grad=grad, **like)
    rank = TensorProxy(shape=(0,) if driver == "gels" else batch, dtype=torch.int64, **like)
    sv = TensorProxy(shape=batch + (builtins.min(m, n),) if driver in ("gelsd", "gelss") else (0,), dtype=real,
                     **like)
    return torch.return_types.linalg_lstsq((solution, residuals, rank, sv))


lstsq_leaf = register_leaf(Symbol("lstsq_call", meta=_lstsq_meta, module="ltorch", tags={Tag.OPAQUE},
                                  torch_fn=torch.linalg.lstsq))
"""``torch.linalg.lstsq`` as one torch call (``Tag.OPAQUE``: its gradients are
PyTorch's autograd's), with shapes from ``_lstsq_meta``."""


@torchsymbol(torch.linalg.lstsq)
def linalg_lstsq(A, B, rcond=None, *, driver=None):
    return lstsq_leaf(A, B, rcond, driver=driver)


# --- grouped matmul (mixture of experts): ATen's one kernel, shapes per its rules -------------------

GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _grouped_mm_meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """``_grouped_mm``'s output: ``offs`` (1-d int32, cumulative group ends)
    cuts the jagged dimension of each 2-d operand. 2-d x 3-d: rows of ``mat_a``
    per group, ``(M, N)``; 3-d x 3-d: a batch, ``(G, M, N)``, no ``offs``;
    2-d x 2-d: the contraction dimension per group, ``(G, M, N)``; 3-d x 2-d:
    columns of ``mat_b`` per group, ``(M, N)``. (torch's own Meta kernel takes
    bfloat16 only, the CPU kernel float32 and float16 too.)"""
    check(isinstance(mat_a, TensorProxy) and isinstance(mat_b, TensorProxy),
          lambda: "grouped_mm: mat_a and mat_b must be tensors")
    check(mat_a.ndim in (2, 3) and mat_b.ndim in (2, 3),
          lambda: f"grouped_mm: mat_a and mat_b must be 2-d or 3-d, got {mat_a.ndim}-d and {mat_b.ndim}-d")
    _same_dtype(mat_a, mat_b, "grouped_mm")
    check(mat_a.dtype in GROUPED_MM_DTYPES,
          lambda: f"Expected mat_a to be Float32, BFloat16 or Float16 matrix, got {mat_a.dtype}")
    check(bias is None, lambda: "grouped_mm: bias is not supported (PyTorch's kernel refuses it too)",
          NotImplementedError)
    check(out_dtype is None or out_dtype == mat_a.dtype,
          lambda: "Grouped gemm output dtype must match `mat_a` dtype", NotImplementedError)
    batched = mat_a.ndim == 3 and mat_b.ndim == 3
    check((offs is None) == batched, lambda: "Have to provide offsets if there is a 2d matrix, or no offset "
                                             "if both matrices are 3d")
    if offs is not None:
        check(isinstance(offs, TensorProxy) and offs.ndim == 1 and offs.dtype is torch.int32,
              lambda: "grouped_mm: offs has to be a 1-d int32 tensor")
        check(offs.device == mat_a.device, lambda: "grouped_mm: offs must be on mat_a's device")
    check(mat_a.device == mat_b.device, lambda: f"grouped_mm: expected both operands on one device, got "
                                               f"{mat_a.device} and {mat_b.device}")
    check(mat_a.shape[-1] == mat_b.shape[-2],
          lambda: "contraction dimension of mat_a and mat_b must match")
    groups = mat_a.shape[0] if batched else offs.shape[0]
    if mat_a.ndim == 3:
        check(mat_a.shape[0] == groups, lambda: "matrix batch sizes have to match")
    if mat_b.ndim == 3:
        check(mat_b.shape[0] == groups, lambda: "matrix batch sizes have to match")
    return TensorProxy(shape=_grouped_mm_shape(mat_a.shape, mat_b.shape, groups), dtype=mat_a.dtype,
                       device=mat_a.device, requires_grad=mat_a.requires_grad or mat_b.requires_grad)


def _grouped_mm_shape(a_shape, b_shape, groups) -> tuple:
    if len(a_shape) == 2 and len(b_shape) == 3:
        return (a_shape[0], b_shape[2])
    if len(a_shape) == 3 and len(b_shape) == 2:
        return (a_shape[1], b_shape[1])
    return (groups, a_shape[-2], b_shape[-1])


def _run_grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if type(mat_a) is FakeTensor:
        return _fake_grouped_mm(mat_a, mat_b, offs)
    return torch._grouped_mm(mat_a, mat_b, offs, bias, out_dtype)


def _fake_grouped_mm(mat_a, mat_b, offs):
    """The kernel's output on fake tensors (a rehearsal, executors/rehearsal.py):
    torch's own fake kernel takes bfloat16 only. Rows padded to 16 bytes, as
    the kernel allocates them."""
    shape = _grouped_mm_shape(mat_a.shape, mat_b.shape, mat_a.shape[0] if offs is None else offs.shape[0])
    per_row = builtins.max(1, 16 // mat_a.element_size())
    padded = -(-shape[-1] // per_row) * per_row
    return torch.empty((*shape[:-1], padded), dtype=mat_a.dtype, device=mat_a.device)[..., :shape[-1]]


grouped_mm_call = register_leaf(Symbol("grouped_mm_call", meta=_grouped_mm_meta, module="ltorch",
                                       tags={Tag.OPAQUE}, torch_fn=_run_grouped_mm))
"""``_grouped_mm`` as one torch call whose gradients are PyTorch's autograd's:
the calls ``grouped_mm``'s own VJP rule (autodiff/torch_rules.py) does not cover."""

_GROUPED_MM_FNS = tuple(f for f in (getattr(torch.nn.functional, "grouped_mm", None),
                                    getattr(torch, "_grouped_mm", None)) if f is not None)


@torchsymbol(*_GROUPED_MM_FNS, torch_fn=_run_grouped_mm)
def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """``F.grouped_mm``/``torch._grouped_mm``: the executor runs ATen's grouped
    kernel, forward and (its VJP rule) backward, as eager does."""
    return grouped_mm_call(mat_a, mat_b, offs, bias, out_dtype)
