"""Probes: what the compilers did, read from ``torch._dynamo`` and ``thunder.compile_stats`` into
:class:`~telemetry_jit.records.CompileRecord` objects."""
