"""The daemon's probe scheduling: the periodic probe, the hot probe, what the daemon remembers of
their cycles (:mod:`.probe_state`, read by the exporter) and :mod:`.wiring`, which builds them from
the settings."""
