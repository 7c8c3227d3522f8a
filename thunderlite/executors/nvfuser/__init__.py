"""The nvFuser fusion executor: regions translated prim by prim
(``translate``) into ``nvfuser_direct`` fusions (``executor``).

May import ``core``, ``transforms`` and ``executors.base``.
"""
