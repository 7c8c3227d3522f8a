"""The torch language's symbols, one module per family of torch ops
(elementwise, reductions, shapes, indexing, creation, linalg, nn, pooling,
composites, in-place variants, RNG, grad mode, collectives, data-dependent sizes).

May import ``core``, ``interpreter`` and ``thunderlite.torch``'s registry,
utils, sizes and opaque fallback; never ``transforms`` or ``executors``.
"""
