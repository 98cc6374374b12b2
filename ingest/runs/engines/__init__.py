"""Engines: how each kind of run (reference, sglang, ...) is executed on a Host and turned
into a result bundle."""
