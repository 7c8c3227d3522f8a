"""The IR: dtypes, devices, proxies, symbols, traces, prims. Knows nothing of
the torch language, transforms or executors (docs/architecture.md §2)."""
