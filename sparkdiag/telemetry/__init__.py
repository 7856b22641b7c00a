"""Immutable telemetry snapshots and the poller that produces them."""
