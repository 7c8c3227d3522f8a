"""Split, don't refuse: a program that needs a traced value in Python (``if
loss > 0``, ``.item()`` compared, ``float(t)`` decided on, a number formatted)
becomes a tree of compiled pieces, split where the value is read
(docs/architecture.md §16).

``splitter.py`` splits one interpretation and compiles its pieces, ``tree.py``
holds them and runs a call along them, ``sites.py`` knows where a program
needs a value, ``liveness.py`` what it may still read after a split.

May import what frontend may import (executors, transforms, the torch
language, core, interpreter) and the frontend modules beside it other than
``compile`` and ``hooks``, which call into it; never ``api``."""
from thunderlite.frontend.splits.sites import NOT_SPLIT, index_request, native_request, request, size_request
from thunderlite.frontend.splits.splitter import Resume, SplitRefused, Splitter, after_split, mark_after_split
from thunderlite.frontend.splits.tree import MAX_PATHS, SplitBudget, SplitEntry

__all__ = ["Splitter", "Resume", "SplitRefused", "SplitBudget", "SplitEntry", "MAX_PATHS", "request", "native_request",
           "index_request", "size_request", "NOT_SPLIT", "after_split", "mark_after_split"]
