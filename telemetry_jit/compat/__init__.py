"""Adapters for the packages telemetry-jit reads beyond their public API: one module per package.

Every private name of torch, nv-one-logger, lightning-thunder and Lightning that telemetry-jit touches
lives in :mod:`.torch`, :mod:`.nv_one_logger`, :mod:`.thunder` or :mod:`.lightning`; no other module reaches into those
internals. Supporting a new release means editing its adapter alone.
"""
