"""``sparkdiag soak``: sustained load on one or all GPUs with measurement windows, and a verdict
per kernel on whether its throughput holds as the GPU (and its memory) heats up.

The worker (``probe/worker/soak.py``) does the load, the windows and the safety stops;
this package runs it (:mod:`.run`), judges the windows (:mod:`.verdict`), writes the records
(:mod:`.model`: JSON and CSV; :mod:`.plot`: PNGs; :mod:`.state`: the latest verdict per GPU in the
state directory) and renders the text (:mod:`.render`); :mod:`.command` is the click command.
"""
