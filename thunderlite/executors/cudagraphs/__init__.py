"""CUDA graphs over final traces: which regions are captured and why the rest
is not (``plan``), and their capture and replay with the user-facing
``CUDAGraphs`` transform (``runtime``).

May import ``core``, ``transforms`` and ``executors.torchcompile`` (its region
helpers).
"""
