"""Structured outputs: constrain what a request may generate to a JSON schema, a regex, a choice
or a grammar, with xgrammar or llguidance compiling the constraint into a per-token mask.

The package is split by job and imported lazily: ``params`` (the user's request, crossing the
ring) is imported by ``engine.sampling_params``; the backends, the compile pool and the bitmask
code are imported by the EngineCore only when the first constrained request arrives, so an
engine that never sees one never pays for xgrammar's import.
"""
