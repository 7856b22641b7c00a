"""Prometheus exposition: one collector per file, rendering the latest snapshot at scrape time."""
