"""Engines: how each kind of run (reference, sglang, import) is executed on a Host and turned into
a result bundle. The interface (what an engine receives, returns and reports) is in `base`; each
engine module ends with its `ENGINE`; `registry.ENGINES` finds them by name. This package's
`__init__` imports nothing, so that spec parsing (which reads `sglang_choices`) stays free of I/O.
"""
