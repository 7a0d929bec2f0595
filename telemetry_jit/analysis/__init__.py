"""Analysis of telemetry files (reader, summary, HTML report, Chrome trace). Imports neither torch,
Lightning, nv-one-logger nor OpenTelemetry."""
