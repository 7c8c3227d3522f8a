"""Trace -> trace passes: alias barriers and functionalization (``aliasing/``),
autodiff (``autodiff/``), DCE, fusion regions, claiming, memory passes.

May import ``core``, the torch language (``thunderlite.torch``) and
``interpreter``; never an executor module, ``frontend`` or ``api``.
"""
