"""The IR: dtypes, devices, proxies, symbols, traces, prims.

May import ``interpreter`` only: it knows nothing of the torch language,
transforms or executors (docs/architecture.md §2)."""
