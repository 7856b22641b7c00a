"""``sparkdiag watch``: follow a job and say why it is slow (sampler, diagnosis, rendering)."""
