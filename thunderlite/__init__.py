"""thunderlite: a trace-based JIT for PyTorch programs."""
