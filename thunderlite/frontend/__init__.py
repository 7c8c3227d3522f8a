"""Frontend: the glue between the interpreter and traces (hooks, provenance,
cache keys, prologue/epilogue, the compile pipeline). See README.md here."""
