"""The symmetric-memory executor: which arguments ops declare symmetric and
the pass that allocates them in symmetric buffers (``plan``), and the
executor with its CUDA backend (``executor``).

May import ``core``, the torch language, ``transforms`` and ``executors.base``.
"""
