"""The poller that samples the sources into immutable snapshots (:mod:`sparkdiag.snapshot`),
its wiring, and the one busy rule."""
