"""The alias model over traces: alias groups and barriers after writes
(``update_aliases``), eager's write errors, functionalization of writes into
views and inputs, view geometry and eager's layouts.

May import ``core`` and the torch language; nothing else in ``transforms``.
"""
