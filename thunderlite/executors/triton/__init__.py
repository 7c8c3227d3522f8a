"""The Triton fusion executor: regions analysed as one kernel (``plan``),
Triton source generated prim by prim (``codegen``), kernels compiled and
launched (``runtime``, the only module importing ``triton``), ``executor``.

May import ``core``, ``transforms`` and ``executors.base``/``torchex``.
"""
