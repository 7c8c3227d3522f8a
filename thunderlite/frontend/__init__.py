"""Frontend: the glue between the interpreter and traces (hooks, provenance,
cache keys, prologue/epilogue, the compile pipeline). See README.md here.

May import every layer below it (executors, transforms, the torch language,
core, interpreter); never ``api`` or the front doors above it."""
