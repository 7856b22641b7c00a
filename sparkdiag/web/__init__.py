"""The HTTP server: ``/metrics`` and the landing page, TLS and basic auth from an exporter-toolkit
web configuration file, connection limits and timeouts. It serves what :mod:`sparkdiag.exporter`
renders."""
