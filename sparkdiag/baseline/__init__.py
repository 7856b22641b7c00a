"""Healthy baselines and what a probe result is judged against: the store (SQLite, its schema and
its health), the published reference figures, and :mod:`.evaluate`, which turns a worker document
into figures compared with both."""
