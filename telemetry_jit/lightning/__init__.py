"""The Lightning side: nv-one-logger's time events, compile telemetry, ``JitTransform``, the hooked
trainer and Fabric."""
