"""A GPU judged against its peers: in one node (``check``, the daemon's node ratio), before its
baseline is learned, and across the fleet (``sparkdiag fleet``, over Prometheus).

``compare`` holds the arithmetic and the thresholds that every one of them shares; ``promapi``
asks a Prometheus through its HTTP API; ``fleet`` turns its answers into the ranked view.
"""
