"""ThunderFX: thunderlite as a ``torch.compile`` backend.

- ``ThunderCompiler(**jit_options)``: the backend object
  (``torch.compile(model, backend=ThunderCompiler(executors=[...]))``).
- ``backend="thunderlite"``: registered through the ``torch_dynamo_backends``
  entry point (``thunderlite_backend``), available after ``pip install``.
- ``thunderfx(fn_or_module, **options)``: ``torch.compile`` with a fresh
  ``ThunderCompiler``; the result carries it, so ``last_traces(compiled)`` and
  ``report(compiled)`` show every thunderlite piece and every split.

A front door above ``api``: may import it and every layer below.
"""
from __future__ import annotations

from thunderlite.dynamo.compiler import ThunderCompiler
from thunderlite.dynamo.frontdoor import last_backward_traces, last_traces, report, thunderfx, thunderlite_backend

__all__ = ["ThunderCompiler", "thunderfx", "thunderlite_backend", "last_traces", "last_backward_traces", "report"]
