"""The truth oracle: a zoo of models no one on this project wrote, each trained under ``HookedTrainer``, and every
statement telemetry-jit makes about the run checked against torch's own record of it (``scripts/oracle.py``,
docs/oracle.md)."""
