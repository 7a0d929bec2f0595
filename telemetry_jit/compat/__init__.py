"""Adapters for the packages telemetry-jit reads beyond their public API, one module per package: no other
module reaches into their internals, so supporting a new release means editing its adapter alone."""
