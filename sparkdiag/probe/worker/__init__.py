"""sparkdiag GEMM and memory-bandwidth probe worker.

It runs as one self-contained script in a fresh interpreter that has torch and
need not have sparkdiag: at module level it imports only the standard library;
torch is imported inside functions and pynvml is optional. It is written as the
rooms of this package and assembled into that script when it is run
(``sparkdiag/probe/script.py``), natively or fed to any Python on standard input::

    python3 sparkdiag/probe/worker --device cuda:0   # __main__.py assembles and runs it
    python3 - --device cuda:0 < SCRIPT               # e.g. inside a container

The rooms, each after those it imports from: ``contract`` (SCHEMA, DTYPES,
SUITES, FLAGS: what sparkdiag imports too), ``log`` (stderr), ``nvml``
(conditions, thresholds, busy), ``dtypes`` (each dtype's gate and kernel),
``timing`` (batches, graph replays), ``plan`` (the suite's kernels and budget),
``kernels`` (a kernel's life, groups), ``copies`` (device and host-device
copies), ``output`` (the document), ``pages`` (huge-page host buffers, which
the host storage probe imports too), ``suite``, ``soak`` and ``storage`` (the
three modes) and ``cli`` (the entry, the only importer of torch; ``storage``
imports kvikio, optional, in a function).

It prints exactly one JSON document (schema ``sparkdiag-probe/2``) on
standard output; everything else (torch warnings, diagnostics) goes to
standard error. The exit status is 0 whenever the document was printed, even
when kernels were unsupported or failed their correctness check; it is
non-zero only when the worker itself broke (it still tries to print a
document with status "error" and the traceback as the reason).

The method follows mamf-finder: normal random inputs (never zeros), warm-up
iterations, CUDA events around every iteration, input buffers rotated beyond
the L2 cache for memory-bound (decode) shapes, and a correctness spot check of
every kernel against a float64 reference so a broken kernel can never look
fast.

Suites (``--suite``; SUITES holds each one's defaults, explicit arguments win)
-------------------------------------------------------------------------------
- ``default``: the periodic probe. Every dtype at the compute-bound cube (bf16
  also with beta=1), the LLM shape 4096x11008x4096 and a decode shape (M=1),
  one batch per kernel in dtype order, then the device copy; 150 ms spin-up,
  2 s of GPU time; skips a GPU another process computes on.
- ``hot``: the short probe for a hot or busy GPU. Decode and LLM shapes of
  int4, bf16, fp16, fp8 and nvfp4 (unsupported ones say why), about 100 ms of
  GPU time, no spin-up, measured even when the GPU is busy. The decode
  kernels are set up and warmed up together, then timed in interleaved rounds
  (rotated order), so int4 against bf16/fp16 (``ratios``, from the median
  iterations) is one comparison under the same conditions: contention leaves
  a decode kernel's median iteration alone, the heat that collapses 4-bit
  GEMMs slows int4's.
- ``check``: what ``sparkdiag check`` judges: bf16, fp16, fp8, nvfp4 (where the
  GPU has it) and int4 at every shape, the decode kernels interleaved as in
  ``hot``, 1.5 s of GPU time.

Host-device copies (``transfers``; on in the default and check suites,
``--no-transfers`` to leave out): pinned and pageable host memory, 200 copies
of 64 KiB and 2 of 256 MiB, host to device and back, each kind's data checked
once; ``delivered`` in bytes/s over the total time of the copy loop, launch
cost included, as an application sees it. They run first, so their GPU time
is paid before the kernels share the rest of the budget. On a discrete GPU
they measure the PCIe link (Gen5 x16: 64 GB/s per direction in theory); on
GB10 small pageable copies were reported ~50x slower than pinned. With
``--device cpu`` they are reported unsupported.

Soak (``--soak-seconds S``, ``--window-seconds W``): sustained bf16 matmuls on
the compute cube for S seconds, and a measurement window of the hot suite's
kernels before the load (cold) and every W seconds during it (set up once,
same iteration counts in every window). Each window prints one progress line
``{"soak_window": {...}}`` with the elapsed seconds, every kernel's result,
the int4 ratios and the NVML conditions of the measurement and of the load
period before it; the document's ``soak`` section holds all windows and why
the soak stopped: ``completed``, ``threshold`` (a margin below the GPU's
slowdown threshold or the memory's maximum temperature, read from NVML),
``hw_thermal_slowdown`` (reason 0x40), ``hw_slowdown`` (0x8),
``interrupted`` (SIGINT or SIGTERM) or ``error``. On every way out the GPU
is synchronized and every buffer freed before the document is printed.

Storage (``--storage-read FILE``): the storage probe's path into the GPU. The
file, opened with O_DIRECT and never written (``sparkdiag storage --storage.gpu
N`` hands over its nameless test file as ``/proc/self/fd/N``), is read by
``--storage-threads`` threads in ``--storage-block`` reads into pinned host
memory, on into GPU memory, and by cuFile (kvikio) with the mode it ran in
(GPUDirect Storage or a compatibility mode); the document's ``storage`` section
holds each stage (``worker/storage.py``).

Every result has the same keys whatever the suite; ``gpu_busy_seconds`` is
the GPU time of the copies, the spin-up, warm-ups and timed batches, gaps
included (not the setup, the one untimed call each kernel's correctness check
makes, nor the sleep that holds the stream while a batch is enqueued).

Delivered and peak
------------------
Each kernel is timed in one batch of back-to-back iterations. Two figures come
from it (TFLOPS, TOPS for int8 and int4: DtypeSpec.unit; bytes/s for the device copy):

- ``delivered``: the work of all iterations over the batch's total elapsed
  time, from one CUDA event before the first iteration to one after the last,
  gaps included. It is what a user of a shared or time-sliced GPU gets, and
  what efficiency, baselines and alerts use. On an H200 beside a process
  running a bf16 8192^3 loop it fell to 0.40-0.51 of idle, where the median
  of short kernels did not move at all (they run whole inside their time
  slices). A batch must itself outlast a time slice: batches of 8 ms and
  less read 0.98-1.00 of idle there, so on a GPU every batch lasts at least
  ``--min-batch-ms`` (30) whatever its share of the budget.
- ``peak``: the work of one iteration over the median iteration time,
  comparable with mamf-finder.

So that the batch measures the GPU and not Python, the stream is first held
by a sleep kernel long enough for the CPU to enqueue the whole batch
(LaunchModel, ``--launch-us``, ``--max-prequeue-ms``); ``queued_ahead`` in a
result says whether it was. That is not enough for decode kernels of 20-30 us,
which Python launches barely faster than the GPU runs them (fp8 and int4
decode lost 13-25 % of an idle H200 to launch gaps in 30 ms batches): on a
GPU each decode batch is captured as a CUDA graph (an eighth of it, replayed
until the batch lasts the floor) and timed between two events (``--graphs``,
``timing: graph`` in the result); its median and peak come from a short
event-timed batch run beside it, whose per-iteration events make the peak of
a decode kernel read low (idle on the H200, delivered 1.01-1.14x peak). On
CPU both figures come from perf_counter, and the total encloses every
iteration.

Spread of a total-time figure on a power-capped GPU
---------------------------------------------------
The total is a mean over the batch: unlike the median it counts every slow
iteration, so its cycle-to-cycle spread depends on what the batch spans.

1. Long enough in time, not in count. Under a bf16 or fp8 8192^3 load an
   H200 runs into its power cap (sw_power_cap) and the controller moves the
   SM clock over tens of milliseconds; a batch that spans several of its
   swings averages over the same mixture every cycle. The budget is shared
   by weight (``--kind-weights``, default compute 4, llm 1.5, decode 0.5,
   bandwidth 1) so compute-bound kernels get the longest batches;
   ``--budget-fraction`` is the part of ``--budget-seconds`` planned for.
2. Short kernels need many iterations: a decode batch of 300 iterations of
   30 us lasts 9 ms, and one hiccup of a few hundred microseconds moves it by
   several percent. ``--min-batch-ms`` (30) and ``--max-iters`` (4000) let a
   decode batch run 1000-1400 iterations.
3. The state a batch starts in. An idle GPU ramps its clocks up during the
   first kernels (``--spinup-ms`` of untimed matmuls first, not in the hot
   suite); and a compute kernel that follows low-power decode kernels first
   runs at boost until the controller clamps again (fp8 and tf32 8192^3 read
   10-12 % above their medians in some idle cycles). The warm-up floor per
   kind (``--warmup-ms``) lets a kernel run into the regime it is timed in; a
   longer compute warm-up trades timed iterations for a steadier start.
4. Gaps that are not the GPU's: the prequeue hold keeps the CPU's launch
   overhead out, and Python's garbage collector is paused while a batch is
   enqueued. The stream's queue is finite (about a thousand commands; every
   iteration takes three), so the CPU is often still enqueuing when the GPU
   starts: ``queued_ahead`` then reads false, which costs nothing as long as
   each kernel outlasts its launch (on the H200, 22-36 us decode kernels
   lost the same 4 % to gaps in batches of 1000 and of 4000 iterations);
   ``gaps_ms`` says what the GPU waited.
5. Order: ``--order kind`` runs every compute shape first, then the LLM and
   the decode shapes. On the H200 it lowered the compute CVs (fp8 8192^3
   4.2 % to 2.5 %) but raised the LLM ones and made decode unstable with the
   median; it is a switch to try again with the total-time figure.

What no knob removes: cycles minutes apart start from different temperatures,
and a cold GPU boosts longer. All of the above are arguments so that they can
be tuned on the device without editing the worker.
"""
