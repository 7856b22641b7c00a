"""The diagnosis with the job's stacks, as pure functions of synthetic recordings: what each
stack is read as (stacks.py), how a tick's lost time is shared out (attribute.py), and the
causes the issue's H200 jobs must get (a GPT-2 tokenizing in its loop, scoring its logits on the
host, a ResNet fed by pageable copies, a launch-bound loop, a Lightning checkpoint, a
recompiling torch.compile, a co-tenant, healthy jobs), with stacks and with counters alone."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sparkdiag.watch import attribute
from sparkdiag.watch import stacks as st
from sparkdiag.watch.diagnose import diagnose
from sparkdiag.watch.model import ProcessLoad, Recording, ThreadInfo, load
from sparkdiag.watch.render import to_json
from sparkdiag.watch.threads import read_recording
from tests.support.watch import (
    Stack,
    const,
    during,
    frame,
    loop,
    names,
    others,
    periodic,
    sole_cause,
    timeline,
    with_stacks,
    with_threads,
)

STDLIB = "/usr/lib/python3.11/"
# what a training loop's thread does, as py-spy shows it
TOKENIZE = loop(
    20, "ids = tokenize(texts[step])",
    frame("tokenize", "/job/train.py", 11, "return [vocab[c] for c in text]"),
)  # fmt: skip
ITEM = loop(25, "total += loss.item()")
MODEL = loop(22, "loss = model(ids).loss",
             frame("GPT2LMHeadModel.forward", "transformers/models/gpt2/modeling_gpt2.py", 1200),
             frame("Linear.forward", "torch/nn/modules/linear.py", 125))  # fmt: skip
TO_HOST = loop(30, "scores = logits.float().cpu().numpy()")
SCORING = loop(31, "acc = (scores.argmax(-1) == labels).mean()",
               frame("_mean", "numpy/_core/_methods.py", 118))  # fmt: skip
COPY = loop(18, "x = batch.cuda()")
MATMUL = loop(40, "y = x @ w")
SAVE = loop(
    45, "trainer.fit(model)",
    frame("Trainer.save_checkpoint", "lightning/pytorch/trainer/trainer.py", 1365),
    frame("save", "torch/serialization.py", 944),
    frame("_save", "torch/serialization.py", 1180),
)  # fmt: skip
COMPILE = loop(
    40, "loss = train_step(x)",
    frame("_TorchDynamoContext.__call__._fn", "torch/_dynamo/eval_frame.py", 655),
    frame("ConvertFrame.__call__", "torch/_dynamo/convert_frame.py", 1432),
    frame("_compile", "torch/_dynamo/convert_frame.py", 1107),
)  # fmt: skip
LOADER_WAIT = loop(
    14, "for x, y in loader:",
    frame("_BaseDataLoaderIter.__next__", "torch/utils/data/dataloader.py", 733),
    frame("_MultiProcessingDataLoaderIter._next_data", "torch/utils/data/dataloader.py", 1480),
    frame("_MultiProcessingDataLoaderIter._get_data", "torch/utils/data/dataloader.py", 1442),
    frame("Queue.get", "multiprocessing/queues.py", 113),
)  # fmt: skip
LOADER_FETCH = loop(
    14, "for x, y in loader:",
    frame("_BaseDataLoaderIter.__next__", "torch/utils/data/dataloader.py", 733),
    frame("_SingleProcessDataLoaderIter._next_data", "torch/utils/data/dataloader.py", 789),
    frame("_MapDatasetFetcher.fetch", "torch/utils/data/_utils/fetch.py", 52),
    frame("Texts.__getitem__", "/job/data.py", 12, "return self.tokenizer(self.rows[i])"),
    frame("Tokenizer.encode", "tokenizers/implementations/base_tokenizer.py", 230),
)  # fmt: skip


def mix(*parts: tuple[Stack, float]) -> list[tuple[Stack, float]]:
    return list(parts)


def read(stack: Stack) -> st.Reading:
    return st.read(stack, list(range(len(stack))))


# ---- what a stack is read as --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stack", "activity", "site"),
    [
        (TOKENIZE, st.USER, 2),
        (ITEM, st.SYNC, 1),
        (MODEL, st.LAUNCH, 1),
        (TO_HOST, st.SYNC, 1),
        (SCORING, st.USER, 1),
        (COPY, st.COPY, 1),
        (MATMUL, st.LAUNCH, 1),
        (SAVE, st.CHECKPOINT, 1),
        (COMPILE, st.COMPILE, 1),
        (LOADER_WAIT, st.DATALOADER, 1),
        (LOADER_FETCH, st.DATA_PREP, 5),
        (loop(9, "time.sleep(0.1)"), st.WAITING, 1),
        (loop(9, "batch = q.get()", frame("Queue.get", "/usr/lib/python3.11/queue.py", 180)),
         st.WAITING, 1),
        (loop(9, "print(f'loss {loss}')",
              frame("Tensor.__format__", "torch/_tensor.py", 1050)), st.SYNC, 1),
        (loop(9, "torch.cuda.synchronize()",
              frame("synchronize", "torch/cuda/__init__.py", 985)), st.SYNC, 1),
        (loop(9, "log.info('step %d', i)",
              frame("Logger.info", STDLIB + "logging/__init__.py", 1489)), st.LOGGING, 1),
        (loop(9, "optimizer.step()",
              frame("Adam.step", "torch/optim/adam.py", 213)), st.OPTIMIZER, 1),
        (loop(9, "dist.all_reduce(t)",
              frame("all_reduce", "torch/distributed/distributed_c10d.py", 9)), st.COLLECTIVE, 1),
        (loop(9, "save_file(state, path)",
              frame("save_file", "safetensors/torch.py", 286)), st.CHECKPOINT, 1),
        (loop(9, "img = aug(img)",
              frame("ColorJitter.forward", "torchvision/transforms/transforms.py", 1280)),
         st.DATA_PREP, 1),
        (loop(9, "x = np.asarray(batch)", frame("cudaStreamSynchronize",
                                                 "/usr/lib/libcudart.so.13", 0)), st.SYNC, 1),
    ],
)  # fmt: skip
def test_each_stack_is_read_as_what_the_thread_did(stack: Stack, activity: str, site: int) -> None:
    reading = read(stack)
    assert reading.activity == activity
    assert reading.site == site  # the innermost line of the job's own code


def test_library_paths_and_short_names() -> None:
    assert st.library_path("/x/lib/python3.11/site-packages/torch/serialization.py") == (
        "torch/serialization.py"
    )
    assert st.library_path("/usr/lib/python3.11/threading.py") == "threading.py"
    assert st.library_path("/job/train.py") is None
    assert st.short_file("/job/sub/train.py", "/job") == "sub/train.py"
    assert st.short_file("/other/train.py", "/job") == "/other/train.py"


def _recording(at: object, **series: object) -> Recording:
    return with_stacks(timeline(**series), at)  # type: ignore[arg-type]


def test_host_work_after_a_sync_in_the_same_function_is_the_sync_s() -> None:
    """numpy scoring below the line that copied the logits to the host is that sync's work,
    not data preparation; the same numpy call in another function is not."""
    rec = _recording(lambda i: mix((TO_HOST, 0.6), (SCORING, 0.4)))
    readings = read_recording(rec)
    by_text = {rec.frames[rec.stacks[i][-1]].text: r.activity
               for i, r in enumerate(readings.stacks)}  # fmt: skip
    assert by_text["scores = logits.float().cpu().numpy()"] == st.SYNC
    assert readings.stacks[1].activity == st.AFTER_SYNC
    elsewhere = _recording(lambda i: mix((SCORING, 1.0)))
    assert read_recording(elsewhere).stacks[0].activity == st.USER


def test_the_training_thread_is_the_one_in_torch_not_a_waiting_one() -> None:
    threads = (ThreadInfo(4242, 4242, "MainThread"), ThreadInfo(4242, 4250, "pin_memory"),
               ThreadInfo(4242, 4251, "logger"))  # fmt: skip
    pin = "torch/utils/data/_utils/pin_memory.py"
    pinning = loop(1, "run()", frame("_pin_memory_loop", pin, 50), frame("pin_memory", pin, 70))
    rec = timeline()
    rec = with_stacks(rec, lambda i: mix((MODEL, 1.0)), threads=threads, thread=lambda i: 0)
    # the same ticks again from the other threads: the pinning thread and a sleeping one
    extra = with_stacks(rec, lambda i: mix((pinning, 1.0)), threads=threads, thread=lambda i: 1)
    assert read_recording(rec).training == frozenset({0})
    assert read_recording(extra).training != frozenset({1})


# ---- sharing a tick's lost time out -------------------------------------------------------------


def test_host_side_work_takes_the_lost_time_first_each_at_most_its_own() -> None:
    # 0.45 s of a 1 s tick lost; tokenizing 0.45 s, waiting in .item() 0.45 s, launching 0.1 s
    parts = attribute.split(0.45, 1.0, [(0, st.USER, 0.45), (1, st.SYNC, 0.45),
                                        (2, st.LAUNCH, 0.1)], "input-starved", False)  # fmt: skip
    assert [(p.cause, p.stack, round(p.seconds, 3)) for p in parts] == [
        ("data-prep-in-loop", 0, 0.45)
    ]
    # 0.96 s lost; scoring on the host 0.35 s, the rest waiting for the copy back
    parts = attribute.split(0.96, 1.0, [(0, st.AFTER_SYNC, 0.35), (1, st.SYNC, 0.63),
                                        (2, st.LAUNCH, 0.02)], "host-sync", False)  # fmt: skip
    got = {(p.cause, p.stack): round(p.seconds, 3) for p in parts}
    assert got == {
        ("host-sync", 0): 0.35,
        ("host-sync", 1): 0.591,
        ("cpu-bound-launcher", 2): 0.019,
    }
    # nothing that explains idle time: the counters' label
    assert attribute.split(0.5, 1.0, [], "input-starved", False)[0].cause == "input-starved"


# ---- the H200 jobs, with stacks and with counters alone -----------------------------------------


def tokenizing(stacks: bool = True) -> Recording:
    """GPT-2 tokenizing in its loop: 45 % lost, the thread at 69 % of a core (H200, issue)."""
    rec = timeline(util=const(0.55), sm=const(0.5), tensor=const(0.4), thread=const(0.69))
    at = lambda i: mix((TOKENIZE, 0.45), (ITEM, 0.45), (MODEL, 0.10))  # noqa: E731
    return with_stacks(rec, at) if stacks else rec


def test_data_prepared_in_the_loop_names_the_line() -> None:
    cause = sole_cause(diagnose(tokenizing()), "data-prep-in-loop", 0.45, within=0.02)
    (site,) = cause.sites
    assert (site.function, site.file, site.line) == ("tokenize", "/job/train.py", 11)
    assert site.text == "return [vocab[c] for c in text]"
    assert site.share == pytest.approx(0.45, abs=0.02)
    assert "prepared at /job/train.py:11 (tokenize: return [vocab[c] for c in text]): 45 %" in (
        cause.evidence
    )
    assert cause.stacks and cause.stacks[0].frames[-1] == "tokenize (/job/train.py:11)"


def test_data_prepared_in_the_loop_from_counters_alone_is_not_nobody_busy() -> None:
    cause = sole_cause(diagnose(tokenizing(stacks=False)), "data-prep-in-loop", 0.45, within=0.02)
    assert not cause.sites and "cannot be told from other host work" in " ".join(cause.evidence)


def scoring_on_the_host(stacks: bool = True) -> Recording:
    """GPT-2 copying its logits to the host and scoring them with numpy: 96 % lost, a 1.5 GB/s
    device-to-host flow while the GPU idled (H200, issue)."""
    rec = timeline(util=const(0.04), sm=const(0.035), tensor=const(0.03), thread=const(1.0))
    rec = replace(rec, ticks=tuple(
        replace(t, gpus=tuple(replace(g, pcie_tx=1.5e9, pcie_rx=2e7) for g in t.gpus))
        for t in rec.ticks
    ))  # fmt: skip
    at = lambda i: mix((TO_HOST, 0.63), (SCORING, 0.35), (MODEL, 0.02))  # noqa: E731
    return with_stacks(rec, at) if stacks else rec


def test_a_host_sync_names_the_copy_and_the_scoring() -> None:
    d = diagnose(scoring_on_the_host())
    assert d.verdict == "host-sync", [(c.name, round(c.share, 3)) for c in d.causes]
    cause = d.causes[0]
    assert cause.share == pytest.approx(0.96 * 0.98, abs=0.03)
    lines = [(s.line, s.text) for s in cause.sites]
    assert lines[0] == (30, "scores = logits.float().cpu().numpy()")
    assert (31, "acc = (scores.argmax(-1) == labels).mean()") in lines
    evidence = " ".join(cause.evidence)
    assert "synced at /job/train.py:30" in evidence and "worked on the results" in evidence
    assert "device to host 1.5 GB/s" in evidence
    assert "input-starved" not in names(d) and "DataLoader" not in " ".join(cause.actions)


def test_a_device_to_host_flood_from_counters_alone_is_a_host_sync() -> None:
    cause = sole_cause(diagnose(scoring_on_the_host(stacks=False)), "host-sync")
    assert cause.share == pytest.approx(0.96, abs=0.03)
    assert "the job copies results to the host" in " ".join(cause.evidence)


def pageable(stacks: bool = True) -> Recording:
    """ResNet-18 fed by .cuda() of a pageable batch: 54 % lost, 3 GB/s host to device."""
    rec = timeline(util=const(0.46), sm=const(0.42), tensor=const(0.3), thread=const(1.0))
    rec = replace(rec, ticks=tuple(
        replace(t, gpus=tuple(replace(g, pcie_rx=3e9, pcie_tx=1e7) for g in t.gpus))
        for t in rec.ticks
    ))  # fmt: skip
    at = lambda i: mix((COPY, 0.5), (ITEM, 0.4), (MODEL, 0.1))  # noqa: E731
    return with_stacks(rec, at) if stacks else rec


def test_pageable_copies_say_direction_rate_and_that_the_memory_is_not_pinned() -> None:
    d = diagnose(pageable())
    assert d.verdict == "pageable-copies"
    cause = d.causes[0]
    assert cause.share == pytest.approx(0.54, abs=0.06)
    assert cause.sites[0].text == "x = batch.cuda()"
    evidence = " ".join(cause.evidence)
    assert "host to device 3.0 GB/s" in evidence and "each time it copied" in evidence
    assert "pageable memory" in evidence
    assert cause.actions[0].startswith("copy from pinned memory")


def test_a_host_to_device_flood_from_counters_alone_is_a_copy_cause() -> None:
    cause = sole_cause(diagnose(pageable(stacks=False)), "pageable-copies", 0.54, within=0.02)
    assert "nor whether its memory is pinned" in " ".join(cause.evidence)


def test_a_flood_while_the_thread_waits_stays_input_starved() -> None:
    """The H200's starved job: pinned 134 MB batches from a loader thread that sleeps, the main
    thread at 42 % of a core: the copies are not the cause."""
    rec = timeline(util=const(0.41), sm=const(0.27), thread=const(0.42))
    rec = replace(rec, ticks=tuple(
        replace(t, gpus=tuple(replace(g, pcie_rx=7.2e9) for g in t.gpus)) for t in rec.ticks
    ))  # fmt: skip
    assert diagnose(rec).verdict == "input-starved"


def launching(stacks: bool = True) -> Recording:
    """512x512 matmuls launched one by one: utilization 35 %, SMs 12 % (a third of each
    kernel's time: small kernels), the thread at 100 %."""
    rec = timeline(util=const(0.35), sm=const(0.12), tensor=const(0.1), thread=const(1.0))
    return with_stacks(rec, lambda i: mix((MATMUL, 1.0))) if stacks else rec


@pytest.mark.parametrize("stacks", [True, False])
def test_a_launch_bound_loop_is_launch_bound(stacks: bool) -> None:
    cause = sole_cause(diagnose(launching(stacks)), "cpu-bound-launcher", 0.88, within=0.01)
    if stacks:
        assert cause.sites[0].text == "y = x @ w"
        assert "launched at /job/train.py:40" in " ".join(cause.evidence)


@pytest.mark.parametrize(("thread", "launcher"), [(0.56, False), (0.80, False), (1.0, True)])
@pytest.mark.parametrize("synced", [0.0, 0.1])
def test_gaps_beside_a_thread_blocked_in_its_launches_are_not_the_launcher_s(
    thread: float, launcher: bool, synced: float
) -> None:
    """ResNet-50 built healthy, on the H200 (docs/device/2026-12-04/healthy/): GPU busy 84 %
    with SMs 72 % active, the training thread at 56 % of a core and in torch's launching
    frames 86 % of its sampled time: off the CPU for much of its launches, so not what kept
    the GPU waiting; it read cpu-bound-launcher 11 %. The same gaps beside a hot thread are the
    launcher's. The time launching took goes to no other cause either: not to the counters'
    label (data prep), nor to a small sync beside it (10 % of the samples at ``.item()``)."""
    rec = timeline(util=const(0.84), sm=const(0.72), thread=const(thread))
    at = (lambda i: mix((MATMUL, 1.0 - synced), (ITEM, synced))) if synced else (
        lambda i: mix((MATMUL, 1.0)))  # fmt: skip
    d = diagnose(with_stacks(rec, at))
    if launcher:
        cause = d.causes[0]
        assert cause.name == "cpu-bound-launcher", names(d)
        assert "the time lost is the gaps between them" in " ".join(cause.evidence)
    else:
        assert d.verdict == "healthy" and d.causes == (), [(c.name, c.share) for c in d.causes]


SAVING = periodic(7, 15)  # ticks 7-14 of every 20: a checkpoint


def checkpointing(stacks: bool = True) -> Recording:
    """A Lightning job saving every 10 s: the step ends half-way through tick 7, serialises
    (GPU stopped) through tick 13 with a write burst on tick 12, and starts again half-way
    through tick 14; the thread busy throughout."""
    util = lambda i: {7: 0.5, 14: 0.5}.get(i % 20, 0.02 if SAVING(i) else 0.99)  # noqa: E731
    rec = timeline(
        util=util, sm=lambda i: util(i) * 0.9, thread=const(1.0),
        write=during(periodic(12, 13), 2.4e9, 1e5),
    )  # fmt: skip
    at = lambda i: mix((SAVE, 1.0)) if SAVING(i) else mix((MODEL, 0.3), (ITEM, 0.7))  # noqa: E731
    return with_stacks(rec, at) if stacks else rec


@pytest.mark.parametrize("stacks", [True, False])
def test_a_checkpoint_s_serialisation_and_edges_are_the_checkpoint_s(stacks: bool) -> None:
    truth = (6 * 0.98 + 2 * 0.5) / 20  # each tick's GPU time lost, over the window
    cause = sole_cause(diagnose(checkpointing(stacks)), "checkpoint-stalls", truth, within=0.02)
    if stacks:
        site = cause.sites[0]
        assert site.via == "Trainer.save_checkpoint (lightning/pytorch/trainer/trainer.py:1365)"
        assert (site.line, site.text) == (45, "trainer.fit(model)")


def test_a_checkpoint_without_a_write_burst_is_named_from_its_stacks() -> None:
    """Written to a network store at a trickle: no burst, the stacks say torch.save."""
    rec = checkpointing()
    rec = replace(
        rec, ticks=tuple(replace(t, job=replace(t.job, write_bps=1e5)) for t in rec.ticks)
    )
    cause = sole_cause(diagnose(rec), "checkpoint-stalls")
    assert "no write burst stood out" in cause.evidence[0]


def test_torch_compile_recompiling_names_the_call_and_its_stretches() -> None:
    compiling = periodic(3, 5, period=10)
    rec = timeline(util=during(compiling, 0.05, 0.99), sm=during(compiling, 0.04, 0.9),
                   thread=const(1.0))  # fmt: skip
    rec = with_stacks(rec, lambda i: mix((COMPILE, 1.0)) if compiling(i) else mix((ITEM, 1.0)))
    cause = sole_cause(diagnose(rec), "recompiling", 0.2 * 0.95, within=0.02)
    assert cause.sites[0].text == "loss = train_step(x)"
    assert "8 stretches of compiling, the longest 1.0 s" in " ".join(cause.evidence)


def test_waiting_for_dataloader_workers_stays_input_starved_and_names_the_loop() -> None:
    rec = timeline(util=const(0.07), sm=const(0.06), thread=const(0.1),
                   loads=lambda i: (ProcessLoad(5000, "pt_data_worker", 1.0),
                                    ProcessLoad(4242, "python3", 0.1, on_gpu=True)))  # fmt: skip
    rec = with_stacks(rec, lambda i: mix((LOADER_WAIT, 0.93), (MODEL, 0.07)))
    cause = sole_cause(diagnose(rec), "input-starved")
    assert "waited at /job/train.py:14 (main: for x, y in loader:)" in " ".join(cause.evidence)


WORKER_IDLE = (
    frame("<module>", "<string>", 1),
    frame("_worker_loop", "torch/utils/data/_utils/worker.py", 292),
    frame("Queue.get", "multiprocessing/queues.py", 113),
)
WORKER_JITTER = (
    frame("<module>", "<string>", 1),
    frame("_worker_loop", "torch/utils/data/_utils/worker.py", 349),
    frame("_MapDatasetFetcher.fetch", "torch/utils/data/_utils/fetch.py", 52),
    frame("Images.__getitem__", "/job/data.py", 30, "img = self.jitter(img)"),
    frame("ColorJitter.forward", "torchvision/transforms/transforms.py", 1280),
)
WORKER_DECODE = (
    *WORKER_JITTER[:3],
    frame("Images.__getitem__", "/job/data.py", 28, "img = decode(self.paths[i])"),
)
LOADER_THREADS = (ThreadInfo(4242, 4242, "MainThread", "python3"),
                  ThreadInfo(5000, 5000, "MainThread", "pt_data_worker"),
                  ThreadInfo(5001, 5001, "MainThread", "pt_data_worker"))  # fmt: skip


def test_a_starved_gpu_names_the_line_its_loader_workers_worked_at() -> None:
    """Two DataLoader workers busy all the time (ColorJitter 70 % of their working time, the
    decode 25 %, 5 % waiting for indexes) while the training thread waits in the loader: the
    workers' lines are named in the evidence; a worker is never the training thread, even where
    its stacks (the dataset's code) would score as one."""
    rec = timeline(util=const(0.07), sm=const(0.06), thread=const(0.1),
                   loads=lambda i: (ProcessLoad(5000, "pt_data_worker", 1.0),
                                    ProcessLoad(5001, "pt_data_worker", 1.0),
                                    ProcessLoad(4242, "python3", 0.1, on_gpu=True)))  # fmt: skip

    def at(i: int) -> list[tuple[int, Stack, float]]:
        worker = [(WORKER_JITTER, 0.7), (WORKER_DECODE, 0.25), (WORKER_IDLE, 0.05)]
        return [(0, LOADER_WAIT, 0.93), (0, MODEL, 0.07),
                *((w, stack, share) for w in (1, 2) for stack, share in worker)]  # fmt: skip

    rec = with_threads(rec, at, threads=LOADER_THREADS)
    readings = read_recording(rec)
    assert readings.training == frozenset({0})
    cause = sole_cause(diagnose(rec), "input-starved")
    said = " ".join(cause.evidence)
    assert "waited at /job/train.py:14 (main: for x, y in loader:)" in said
    assert "the loader processes worked 74 % of their time at /job/data.py:30 " in said, said
    assert "(Images.__getitem__: img = self.jitter(img)), in ColorJitter.forward" in said, said
    assert "worked 26 % of their time at /job/data.py:28" in said


def test_a_dataloader_without_workers_is_data_prepared_in_the_loop() -> None:
    rec = timeline(util=const(0.3), sm=const(0.27), thread=const(1.0))
    rec = with_stacks(rec, lambda i: mix((LOADER_FETCH, 0.7), (MODEL, 0.3)))
    cause = sole_cause(diagnose(rec), "data-prep-in-loop")
    assert cause.sites[0].file == "/job/data.py" and cause.sites[0].line == 12


# what py-spy reads of `python3 -c "import time; time.sleep(4)"`: a line whose text it cannot
# read (no file), so nothing says it sleeps; and a blocking read in the job's own code
SLEEP_IN_C = (frame("<module>", "<string>", 1),)
BLOCKING_READ = loop(16, "raw = sock.recv(1 << 20)")


@pytest.mark.parametrize("stack", [SLEEP_IN_C, BLOCKING_READ])
def test_the_job_s_own_line_at_no_cpu_waited_and_prepared_no_data(stack: Stack) -> None:
    """A thread at 0 % of a core spent no time preparing data, whatever line it stood at: the
    GPU idle beside it is input-starved with nobody busy (as with --stacks off), the line it
    waited at named; the same stacks with the thread busy stay data prepared in the loop."""
    idle = timeline(util=const(0.04), sm=const(0.02), thread=const(0.0))
    d = diagnose(with_stacks(idle, lambda i: mix((stack, 1.0))))
    assert names(d) == ["input-starved"], [(c.name, round(c.share, 3)) for c in d.causes]
    said = " ".join(d.causes[0].evidence)
    assert "nobody in the job was busy" in said and "waited at " in said, said
    assert diagnose(idle).verdict == "input-starved"  # the counters alone agree
    busy = timeline(util=const(0.04), sm=const(0.02), thread=const(1.0))
    assert diagnose(with_stacks(busy, lambda i: mix((stack, 1.0)))).verdict == "data-prep-in-loop"


def test_own_work_takes_at_most_the_time_the_thread_was_on_a_cpu() -> None:
    # 0.8 s of a 1 s tick lost; the job's own code 0.6 s, a sync 0.4 s; the thread busy 0.3 s:
    # 0.3 s of that code prepared data, the other 0.3 s waited at the same line
    parts = attribute.split(0.8, 1.0, [(0, st.USER, 0.6), (1, st.SYNC, 0.4)], "input-starved",
                            False, busy=0.3)  # fmt: skip
    got = {(p.cause, p.stack): round(p.seconds, 3) for p in parts}
    assert got == {("data-prep-in-loop", 0): 0.3, ("input-starved", 0): 0.3, ("host-sync", 1): 0.2}
    # busy as long as it worked (or not measured): as before
    for busy in (0.6, None):
        parts = attribute.split(0.8, 1.0, [(0, st.USER, 0.6), (1, st.SYNC, 0.4)],
                                "input-starved", False, busy=busy)  # fmt: skip
        assert [(p.cause, round(p.seconds, 3)) for p in parts] == [
            ("data-prep-in-loop", 0.6), ("host-sync", 0.2)
        ]  # fmt: skip


@pytest.mark.parametrize("stacks", [True, False])
def test_healthy_jobs_get_no_cause(stacks: bool) -> None:
    rec = timeline(util=const(0.99), sm=const(0.9), thread=const(1.0))
    if stacks:
        rec = with_stacks(rec, lambda i: mix((MODEL, 0.3), (ITEM, 0.7)))
    d = diagnose(rec)
    assert d.verdict == "healthy" and d.causes == ()


# ---- another process on the GPU -----------------------------------------------------------------


def test_a_co_tenant_takes_its_busy_time_and_is_named() -> None:
    """ResNet-50 beside a matmul loop: 54 % lost while NVML read 99 % busy (H200, issue)."""
    rec = others(timeline(util=const(0.46), sm=const(0.42), thread=const(1.0)), const(0.53))
    rec = with_stacks(rec, lambda i: mix((MODEL, 0.1), (ITEM, 0.9)))
    d = diagnose(rec)
    assert d.verdict == "co-tenant", [(c.name, round(c.share, 3)) for c in d.causes]
    cause = d.causes[0]
    assert cause.share == pytest.approx(0.54, abs=0.02)
    (tenant,) = cause.tenants
    assert (tenant.pid, tenant.name, tenant.user) == (777, "python3", "alice")
    assert tenant.gpu_share == pytest.approx(0.53) and tenant.memory_bytes == 12e9
    evidence = " ".join(cause.evidence)
    assert "pid 777 python3 (user alice, container c0ffeec0ffee)" in evidence
    assert "the job's own kernels ran 46 %" in evidence
    assert names(d) == ["co-tenant"]  # its busy time is not the job's: no other cause
    assert "good to about 10 points" not in evidence  # a 40 s window


def test_a_co_tenant_seen_over_a_short_window_says_how_close_its_share_is() -> None:
    rec = others(timeline(n=30, util=const(0.46), sm=const(0.42), thread=const(1.0)), const(0.53))
    cause = diagnose(rec).causes[0]
    assert cause.name == "co-tenant"
    said = " ".join(cause.evidence)
    assert "over this 15 s window the share is good to about 10 points either way" in said
    assert "a window of 30 s or more" in said


def test_a_job_alone_never_gets_a_co_tenant() -> None:
    for rec in (timeline(), tokenizing(), launching(), checkpointing()):
        assert "co-tenant" not in names(diagnose(rec))


def test_a_co_tenant_nvml_cannot_measure_is_a_note_not_a_cause() -> None:
    rec = others(timeline(), const(0.0))
    no_sample = replace(rec, ticks=tuple(
        replace(t, gpus=tuple(replace(g, others=tuple(replace(o, sm=None) for o in g.others))
                              for g in t.gpus)) for t in rec.ticks
    ))  # fmt: skip
    d = diagnose(no_sample)
    assert d.verdict == "healthy"
    assert any("no per-process utilization" in n and "pid 777" in n for n in d.notes)


# ---- the recording and the JSON -----------------------------------------------------------------


def test_json_lists_the_top_stacks_per_cause_and_a_replay_gives_the_same(tmp_path: Path) -> None:
    rec = scoring_on_the_host()
    path = tmp_path / "run.json"
    rec.save(path)
    again = load(path)
    assert again == rec and diagnose(again) == diagnose(rec)
    doc = json.loads(to_json(again, diagnose(again)))
    (cause,) = [c for c in doc["causes"] if c["name"] == "host-sync"]
    top = cause["stacks"][0]
    assert top["frames"][-1] == "main (/job/train.py:30)" and top["share"] > 0.5
    assert cause["sites"][0]["text"] == "scores = logits.float().cpu().numpy()"
    assert doc["stack_sampler"].startswith("py-spy")


def test_a_recording_pointing_past_its_tables_is_refused() -> None:
    from sparkdiag.watch.model import RecordingError, from_json

    doc = tokenizing().to_json()
    doc["stacks"] = [[9999]]
    with pytest.raises(RecordingError, match="names a frame"):
        from_json(doc)
    doc = tokenizing().to_json()
    doc["ticks"][3]["stacks"] = [[0, 9999, 0.1, 1]]
    with pytest.raises(RecordingError, match="names a thread or stack"):
        from_json(doc)


def test_schema_1_recordings_load_and_diagnose_as_before() -> None:
    path = Path(__file__).parents[1] / "docs/device/2026-12-01/part-f/jobs/starved.recording.json"
    assert json.loads(path.read_text())["schema"] == "sparkdiag-watch-recording/1"
    rec = load(path)
    assert rec.stacks == () and rec.frames == () and rec.stack_sampler == ""
    assert diagnose(rec).verdict == "input-starved"


# ---- frames from real frameworks (found running them on a CPU under py-spy) ---------------------


def test_a_library_installed_outside_site_packages_is_a_library() -> None:
    tokenizer = frame(
        "GPT2Tokenizer.bpe", "/tmp/libs/transformers/models/gpt2/tokenization_gpt2.py"
    )
    stack = loop(9, "ids = encode(batch)", tokenizer)
    assert read(stack).activity == st.DATA_PREP and read(stack).site == 1
    assert st.short_file(tokenizer.file) == "transformers/models/gpt2/tokenization_gpt2.py"


def test_lightning_s_step_inside_optimizer_step_is_the_step_not_the_optimizer() -> None:
    closure = loop(
        45, "trainer.fit(model)",
        frame("LightningModule.optimizer_step", "lightning/pytorch/core/module.py", 1306),
        frame("Adam.step", "torch/optim/adam.py", 227),
        frame("_AutomaticOptimization._training_step", "lightning/pytorch/loops/automatic.py", 9),
        frame("Module.training_step", "/job/train.py", 30, "return self.model(ids).loss"),
        frame("Linear.forward", "torch/nn/modules/linear.py", 125),
    )  # fmt: skip
    assert read(closure).activity == st.LAUNCH
    stepping = loop(45, "trainer.fit(model)", frame("Adam.step", "torch/optim/adam.py", 227),
                    frame("_multi_tensor_adam", "torch/optim/adam.py", 600))  # fmt: skip
    assert read(stepping).activity == st.OPTIMIZER
    building = loop(12, "opt = torch.optim.SGD(params)",
                    frame("SGD.__init__", "torch/optim/sgd.py", 65))  # fmt: skip
    assert read(building).activity == st.LAUNCH  # not a step: torch code


def test_the_outermost_frame_decides_and_an_empty_stack_is_nothing() -> None:
    importing = frame("_find_and_load", "<frozen importlib._bootstrap>", 1176)
    compiled = (*COMPILE, importing, frame("<module>", "torch/_inductor/lowering.py", 1))
    assert read(compiled).activity == st.COMPILE  # a compilation that imports: compiling
    started = (frame("<module>", "/job/train.py", 1, "import torch"), importing,
               frame("<module>", "torch/_dynamo/convert_frame.py", 1))  # fmt: skip
    assert read(started).activity == st.IMPORTING
    assert read(()).activity == st.NOTHING


def test_ticks_still_importing_at_the_window_s_start_are_start_up() -> None:
    """A job whose GPU reads busy while it is still importing (a scripted fixture, or a busy
    neighbour): those ticks are not its loop."""
    importing = (frame("<module>", "/job/train.py", 1, "import transformers"),
                 frame("_find_and_load", "<frozen importlib._bootstrap>", 1176))  # fmt: skip
    at = lambda i: mix((importing, 1.0)) if i < 10 else mix((TOKENIZE, 1.0))  # noqa: E731
    rec = with_stacks(timeline(util=const(0.3), sm=const(0.28), thread=const(1.0)), at)
    d = diagnose(rec)
    assert d.window[0] == pytest.approx(10 * 0.5)
    assert sole_cause(d, "data-prep-in-loop").sites[0].function == "tokenize"


def test_launching_named_by_the_stacks_is_launch_bound_whatever_the_kernels_size() -> None:
    """512x512 matmuls fill half the SMs while they run (SM activity 14 % at 25 %
    utilization): not small enough for the counters, but the thread is in the matmul line all
    the time; the loss is the time the SMs did not work, as for any launcher."""
    rec = timeline(util=const(0.25), sm=const(0.14), tensor=const(0.1), thread=const(1.0))
    assert diagnose(rec).verdict == "data-prep-in-loop"  # counters: a busy thread, real kernels
    cause = sole_cause(diagnose(with_stacks(rec, lambda i: mix((MATMUL, 1.0)))),
                       "cpu-bound-launcher", 0.86, within=0.01)  # fmt: skip
    assert cause.sites[0].text == "y = x @ w"
    # the same counters with the thread in its own unnamed code: data prep, not launching
    plain = with_stacks(rec, lambda i: mix((TOKENIZE, 1.0)))
    assert diagnose(plain).verdict == "data-prep-in-loop"


# ---- the rules found on the 2026-12-03 H200 recordings ------------------------------------------

STEP = loop(9, "opt.step()", frame("AdamW.step", "torch/optim/adamw.py", 227),
            frame("_multi_tensor_adamw", "torch/optim/adamw.py", 600))  # fmt: skip


def test_a_gpu_optimizer_step_overlapping_a_busy_gpu_is_not_lost_time() -> None:
    """A healthy ViT-B on the H200 (the recording was lost; its diagnosis said optimizer-step
    11 %): the GPU 88 % busy in every tick, the thread launching, waiting in the step's sync
    and in AdamW's foreach step, whose kernels queue behind the backward's. The step enqueues
    work like launching does: no host work the GPU waited for, no cause."""
    rec = timeline(util=const(0.88), sm=const(0.8), tensor=const(0.6), thread=const(1.0))
    rec = with_stacks(rec, lambda i: mix((MODEL, 0.5), (ITEM, 0.32), (STEP, 0.18)))
    d = diagnose(rec)
    assert d.verdict == "healthy", [(c.name, round(c.share, 3)) for c in d.causes]
    # an optimizer stepping on the CPU (DeepSpeed's CPU Adam) is host work the GPU waits for
    cpu_adam = loop(9, "engine.step()", frame("DeepSpeedCPUAdam.step",
                                              "deepspeed/ops/adam/cpu_adam.py", 150))  # fmt: skip
    assert read(cpu_adam).activity == st.HOST_OPTIMIZER
    slow = timeline(util=const(0.6), sm=const(0.55), tensor=const(0.4), thread=const(1.0))
    slow = with_stacks(slow, lambda i: mix((MODEL, 0.4), (cpu_adam, 0.4), (ITEM, 0.2)))
    assert sole_cause(diagnose(slow), "optimizer-step").share == pytest.approx(0.4, abs=0.02)


FORWARD_COMPILE = loop(
    40, "loss = model(x).pow(2).mean()",
    frame("_TorchDynamoContext.__call__._fn", "torch/_dynamo/eval_frame.py", 655),
    frame("ConvertFrame.__call__", "torch/_dynamo/convert_frame.py", 1432),
)  # fmt: skip
BACKWARD = loop(41, "loss.backward()", frame("Tensor.backward", "torch/_tensor.py", 631),
                frame("backward", "torch/autograd/__init__.py", 381),
                frame("_engine_run_backward", "torch/autograd/graph.py", 869))  # fmt: skip
ENGINE = (frame("BackwardCFunction.apply", "torch/autograd/function.py", 317),
          frame("CompiledFunction.backward",
                "torch/_functorch/_aot_autograd/runtime_wrappers.py", 2748))  # fmt: skip
BACKWARD_COMPILE = (
    *ENGINE,
    frame("_wrapped_bw_compiler", "torch/_dynamo/backends/common.py", 84),
    frame("compile_fx_backward", "torch/_inductor/compile_fx.py", 2436),
)  # fmt: skip
AUTOTUNE = (*ENGINE, frame("CompiledFxGraph.__call__", "torch/_inductor/output_code.py", 656),
            frame("CachingAutotuner.run", "torch/_inductor/runtime/triton_heuristics.py", 1448),
            frame("CachingAutotuner.autotune_to_one_config",
                  "torch/_inductor/runtime/triton_heuristics.py", 1176))  # fmt: skip
RUN_COMPILED = (*ENGINE, frame("CompiledFxGraph.__call__", "torch/_inductor/output_code.py", 656),
                frame("CachingAutotuner.run",
                      "torch/_inductor/runtime/triton_heuristics.py", 1448))  # fmt: skip
ENGINE_THREADS = (ThreadInfo(4242, 4242, "MainThread", "python3"),
                  ThreadInfo(4242, 4300, "", "python3"))  # fmt: skip


def test_a_backward_compiled_on_the_autograd_engine_s_thread_is_recompiling() -> None:
    """The H200's compile-recompile job: each new input length compiles the forward in the
    training thread, then AOTAutograd compiles its backward on the autograd engine's thread
    while the training thread waits in loss.backward() (read alone, launching), and tunes
    each new kernel at its first call; py-spy read some of the training thread's samples
    empty. All of it is recompiling, named at the call that recompiled."""
    compiling = periodic(2, 9, period=10)  # 3.5 s of every 5 s

    def at(i: int) -> list[tuple[int, Stack, float]]:
        phase = i % 10
        if phase in (2, 3, 4):
            return [(0, FORWARD_COMPILE, 0.4), (0, (), 0.6)]
        if phase in (5, 6, 7, 8):
            return [(0, BACKWARD, 1.0), (1, BACKWARD_COMPILE if phase < 8 else AUTOTUNE, 1.0)]
        if phase == 9:
            return [(0, BACKWARD, 1.0), (1, RUN_COMPILED, 0.2)]
        return [(0, ITEM, 0.7), (0, FORWARD_COMPILE[:2] + MODEL[2:], 0.3)]

    rec = timeline(util=during(compiling, 0.0, 0.99), sm=during(compiling, 0.0, 0.9),
                   thread=during(compiling, 0.7, 1.0))  # fmt: skip
    rec = with_threads(rec, at, threads=ENGINE_THREADS)
    readings = read_recording(rec)
    assert readings.training == frozenset({0})  # the engine's thread never trains
    cause = sole_cause(diagnose(rec), "recompiling", 0.7, within=0.01)
    assert cause.sites[0].line == 40  # the backward's compile belongs to that forward's
    assert read(AUTOTUNE).activity == st.COMPILE and read(RUN_COMPILED).activity == st.LAUNCH
    assert "8 stretches of compiling, the longest 3.5 s" in " ".join(cause.evidence)


TORN = (frame("TorchDispatchMode.__enter__", "torch/utils/_python_dispatch.py", 173),)
AT_EXIT = (frame("shutdown_compile_workers", "torch/_inductor/async_compile.py", 120),)


def test_a_stack_py_spy_read_torn_says_nothing() -> None:
    """The H200's rerun of compile-recompile: py-spy reads without stopping the job, and now
    and then read only the innermost frame of a compiling thread's deep stack, a torch frame
    that alone reads as launching (11 % launcher beside 88 % recompiling). A stack of a thread
    the job started that does not begin at the thread's usual first frame is torn and says
    nothing; after the last tick at that frame (exit handlers) stacks are read as they come."""

    def at(i: int) -> list[tuple[Stack, float]]:
        return [(AT_EXIT, 1.0)] if i >= 76 else [(COMPILE, 0.6), (TORN, 0.4)]

    rec = with_stacks(timeline(util=0.0, sm=0.0, thread=0.9), at)
    readings = read_recording(rec)
    torn = next(i for i, s in enumerate(rec.stacks) if rec.frames[s[0]].function != "<module>"
                and rec.frames[s[0]].function.endswith("__enter__"))  # fmt: skip
    assert readings.stacks[torn].activity == st.NOTHING
    exit_stack = next(i for i, s in enumerate(rec.stacks)
                      if rec.frames[s[0]].function == "shutdown_compile_workers")  # fmt: skip
    assert readings.stacks[exit_stack].activity != st.NOTHING
    assert read(TORN).activity == st.LAUNCH  # what it read as before
    d = diagnose(rec)
    assert "cpu-bound-launcher" not in names(d), d.causes


TEARDOWN = loop(45, "trainer.fit(model)",
                frame("Trainer._run", "lightning/pytorch/trainer/trainer.py", 1062),
                frame("Strategy.teardown", "lightning/pytorch/strategies/strategy.py", 532),
                frame("Module.cpu", "torch/nn/modules/module.py", 1165))  # fmt: skip
STAGE = (*loop(45, "trainer.fit(model)"),
         frame("Trainer._run", "lightning/pytorch/trainer/trainer.py", 1057),
         frame("Trainer._run_stage", "lightning/pytorch/trainer/trainer.py", 1100))  # fmt: skip


def test_a_teardown_after_the_loop_is_out_of_the_window() -> None:
    """The H200's Lightning checkpoint job: stalled by its checkpoints most of the time (its
    window opened at 2 % utilization), then Lightning moving the model and the optimizer back
    to the host (GPU at 5 %, copies) for 3 s after the loop: not the job's loop."""
    saving = periodic(2, 16)  # the GPU 2 % in 14 ticks of every 20: serialising

    def at(i: int) -> list[tuple[Stack, float]]:
        if i >= 40:
            return [(TEARDOWN, 1.0)]
        if saving(i):
            return [((*STAGE, *SAVE[2:]), 1.0)]
        return [((*STAGE, *MODEL[2:]), 0.6), ((*STAGE, *ITEM[2:]), 0.4)]

    rec = timeline(
        n=46, util=lambda i: 0.05 if i >= 40 else (0.02 if saving(i) else 0.99),
        sm=lambda i: 0.0 if i >= 40 or saving(i) else 0.9, thread=const(1.0),
        write=during(periodic(15, 16), 2.4e9, 1e5),
    )  # fmt: skip
    d = diagnose(with_stacks(rec, at))
    assert d.window[1] == pytest.approx(40 * 0.5)
    sole_cause(d, "checkpoint-stalls", 28 * (1 - 0.02 / 0.99) / 40, within=0.01)


def test_a_co_tenant_takes_no_time_in_ticks_the_job_ran_no_kernel() -> None:
    """The H200's co-tenant job: its first backward (lazy loading, cuDNN's choice) kept the
    thread on the host 2.5 s with no kernel of its own while the neighbour had the GPU: those
    ticks were not taken from it."""
    first = periodic(20, 30, period=80)  # 5 s in which the job ran no kernel of its own
    rec = timeline(util=during(first, 0.0, 0.46), sm=during(first, 0.0, 0.42), thread=const(1.0))
    rec = others(rec, during(first, 0.99, 0.53))
    rec = with_stacks(rec, lambda i: mix((MODEL, 0.1), (ITEM, 0.9)))
    d = diagnose(rec)
    cause = sole_cause(d, "co-tenant", 70 / 80 * 0.53 / 0.99, within=0.01)
    assert cause.tenants[0].gpu_share == pytest.approx(0.53)


def test_a_backward_wait_recorded_as_no_time_does_not_divide_by_zero() -> None:
    """A wait in backward() that overlapped a tick by under 50 us was recorded as 0.0 s (the
    stacks are kept to 0.1 ms), beside the engine's thread compiling in that tick: the wait
    has no time for the engine's work to fill, and the recording diagnoses (it raised
    ZeroDivisionError, live after --record had saved it, and at every replay)."""

    def at(i: int) -> list[tuple[int, Stack, float]]:
        if i % 4 == 1:
            return [(0, MODEL, 0.9), (0, BACKWARD, 0.0), (1, BACKWARD_COMPILE, 0.5)]
        return [(0, MODEL, 0.6), (0, BACKWARD, 0.4), (1, RUN_COMPILED, 0.2)]

    rec = with_threads(timeline(thread=const(1.0)), at, threads=ENGINE_THREADS)
    readings = read_recording(rec)  # raised ZeroDivisionError
    wait = rec.stacks.index(tuple(rec.frames.index(f) for f in BACKWARD))
    assert all(s.seconds > 0 for k in range(len(rec.ticks)) for s in readings.samples(k))
    assert not [s for s in readings.samples(1) if s.stack == wait]  # nothing filled it
    assert diagnose(rec).verdict == "healthy"


TO_CPU = loop(108, 'logits = np.asarray(out.logits.float().to(torch.device("cpu")))')
TO_DEVICE = loop(108, "logits = out.logits.float().to(device)")


@pytest.mark.parametrize(
    "text",
    ['logits = np.asarray(out.logits.float().to(torch.device("cpu")))',
     "y = x.to(cpu_device)", "y = x.to(device=self.host_cpu, non_blocking=True)",
     'y = x.to(torch.device("CPU"))'],
)  # fmt: skip
def test_a_copy_whose_arguments_name_the_cpu_is_a_host_sync(text: str) -> None:
    """``.to(torch.device("cpu"))`` read as a copy to the GPU ("device"), with pin_memory
    advice, while the PCIe counters read 1.2 GB/s device to host."""
    assert read(loop(108, text)).activity == st.SYNC
    assert read(loop(108, "y = x.to(device)")).activity == st.COPY
    assert read(loop(108, "y = x.to(torch.device('cuda'), non_blocking=True)")).activity == st.COPY


def _copying(stack: Stack, tx: float, rx: float) -> Recording:
    """The thread in one line of copying 0.9 of each tick, the GPU 4 % busy, PCIe at ``tx``
    (device to host) and ``rx`` bytes/s."""
    rec = timeline(util=const(0.04), sm=const(0.035), tensor=const(0.03), thread=const(1.0))
    rec = replace(rec, ticks=tuple(
        replace(t, gpus=tuple(replace(g, pcie_tx=tx, pcie_rx=rx) for g in t.gpus))
        for t in rec.ticks
    ))  # fmt: skip
    return with_stacks(rec, lambda i: mix((stack, 0.9), (MODEL, 0.1)))


def test_a_copy_while_the_traffic_goes_to_the_host_alone_is_a_host_sync() -> None:
    """``.to(device)`` with ``device`` the CPU: the line says nothing of the direction, the
    counters do (1.2 GB/s device to host, 0.5 MB/s host to device): a host sync, not pageable
    copies to the GPU; with the traffic to the GPU, the same line is a copy."""
    d = diagnose(_copying(TO_DEVICE, tx=1.2e9, rx=5e5))
    cause = sole_cause(d, "host-sync")
    assert cause.sites[0].text == "logits = out.logits.float().to(device)"
    evidence = " ".join(cause.evidence)
    assert "synced at /job/train.py:108" in evidence and "device to host 1.2 GB/s" in evidence
    assert not any("pin_memory=True" in a for a in cause.actions)
    assert sole_cause(diagnose(_copying(TO_DEVICE, tx=2.2e8, rx=3.7e9)), "pageable-copies")
    # both ways, or too little to say: as read
    assert sole_cause(diagnose(_copying(TO_DEVICE, tx=1.2e9, rx=2e8)), "pageable-copies")
    assert sole_cause(diagnose(_copying(TO_DEVICE, tx=1e8, rx=0.0)), "pageable-copies")
    assert sole_cause(diagnose(_copying(TO_CPU, tx=1.2e9, rx=2e8)), "host-sync")


EXAMPLE = "/home/u/diffusers/examples/text_to_image/train_text_to_image.py"
ACC = "acc = (logits.argmax(-1) == labels).float().mean().item()"


def _own_loop(file: str, cwd: str) -> Recording:
    """GPT-2-like scoring with .item() in the job's own script at ``file`` (run from ``cwd``),
    the GPU 4 % busy, 1.5 GB/s device to host."""
    stack = (frame("<module>", file, 900, "main()"), frame("main", file, 850, ACC))
    rec = timeline(util=const(0.04), sm=const(0.035), tensor=const(0.03), thread=const(1.0))
    rec = replace(rec, cwd=cwd, ticks=tuple(
        replace(t, gpus=tuple(replace(g, pcie_tx=1.5e9, pcie_rx=2e7) for g in t.gpus))
        for t in rec.ticks
    ))  # fmt: skip
    return with_stacks(rec, lambda i: mix((stack, 0.9), (MODEL, 0.1)))


@pytest.mark.parametrize(
    ("file", "cwd", "named"),
    [
        (EXAMPLE, "/home/u/diffusers/examples/text_to_image", "train_text_to_image.py"),
        (EXAMPLE, "/home/u", "diffusers/examples/text_to_image/train_text_to_image.py"),
        (EXAMPLE, "", EXAMPLE),
        ("/home/u/torch/proj/train.py", "/home/u/torch/proj", "train.py"),  # its cwd
        ("/home/u/torch/proj/train.py", "/", "home/u/torch/proj/train.py"),  # its __main__
        ("/home/u/scripts/transformers/run.py", "/srv", "/home/u/scripts/transformers/run.py"),
    ],
)
def test_the_job_s_own_script_in_a_folder_named_like_a_library_is_its_own(
    file: str, cwd: str, named: str
) -> None:
    """diffusers' example, run from its clone: its .item() read as the library launching
    ("diffusers/" is a model library's folder), not as a host sync."""
    d = diagnose(_own_loop(file, cwd))
    cause = sole_cause(d, "host-sync")
    assert (cause.sites[0].file, cause.sites[0].text) == (named, ACC)
    example = (frame("<module>", EXAMPLE, 900, "main()"), frame("main", EXAMPLE, 850, ACC))
    assert read(example).activity == st.SYNC  # examples/ under a package folder: no library


def test_a_library_s_clone_under_the_job_s_folders_is_still_the_library() -> None:
    """transformers installed from its clone (pip install -e) with the job run from the clone:
    the package folder below the working directory is the library's; a package's own
    folders named like examples/ below the package folder are too."""
    clone = "/repo/transformers"
    model = clone + "/src/transformers/models/gpt2/modeling_gpt2.py"
    assert st.library_path(model, (clone,)) == "transformers/models/gpt2/modeling_gpt2.py"
    assert st.library_path(clone + "/examples/pytorch/run_clm.py", (clone,)) is None
    assert st.library_path(clone + "/examples/pytorch/run_clm.py") is None
    assert st.library_path("/opt/libs/torch/nn/modules/linear.py") == "torch/nn/modules/linear.py"
    assert st.library_path("/opt/libs/torch/utils/scripts/x.py") == "torch/utils/scripts/x.py"
    # python -m torch.distributed.run from a PYTHONPATH folder: not the job's own folder
    run = (frame("_run_module_as_main", "<frozen runpy>", 198),
           frame("<module>", "/opt/libs/torch/distributed/run.py", 9))  # fmt: skip
    assert st.own_roots("/job", run, [(0, 1)]) == ("/job",)
    main = (frame("_run_module_as_main", "<frozen runpy>", 198),
            frame("<module>", "/srv/proj/train.py", 3))  # fmt: skip
    assert st.own_roots("", main, [(0, 1)]) == ("/srv/proj",)
    assert st.short_file("/srv/torch/proj/x.py", "", ("/srv/torch/proj",)) == "/srv/torch/proj/x.py"
    assert st.short_file("/srv/torch/proj/x.py", "/srv/torch/proj") == "x.py"


GRANT_TEXT = "give watch CAP_SYS_PTRACE (root has it unless a container dropped it)"


@pytest.mark.parametrize(
    ("skipped", "said"),
    [
        (("the job's Python stacks: not sampled (--stacks off)",),
         "they were not sampled (--stacks off); watch without it to have them"),
        (("cannot read the Python stacks of pid 42: the job runs as another user: "
          f"{GRANT_TEXT}; its lost time is judged from the counters alone",),
         f"py-spy is installed but may not read the job (the job runs as another user: "
         f"{GRANT_TEXT})"),
        (("no Python stacks of pid 42 (python3): Permission denied (os error 13); "
          f"{GRANT_TEXT}; its lost time is judged from the counters alone",),
         "py-spy is installed but may not read the job (Permission denied (os error 13); "),
        (("no Python stacks of pid 42 (run.sh): not a Python process, or one py-spy does not "
          "know (Failed to find python version); its lost time is judged from the counters "
          "alone",),
         "py-spy could not read the job (not a Python process, or one py-spy does not know "
         "(Failed to find python version))"),
        (("py-spy not found: the job's Python stacks are not sampled, so ...",),
         "install py-spy (pip install 'sparkdiag[stacks]')"),
        ((), "install py-spy (pip install 'sparkdiag[stacks]')"),  # a recording that says not
    ],
)  # fmt: skip
def test_without_stacks_the_report_says_why_there_are_none(
    skipped: tuple[str, ...], said: str
) -> None:
    """ "install py-spy" was advised whatever the reason: with py-spy installed but refused (no
    CAP_SYS_PTRACE), or the stacks turned off with --stacks off."""
    for rec in (tokenizing(stacks=False), scoring_on_the_host(stacks=False),
                pageable(stacks=False)):  # fmt: skip
        d = diagnose(replace(rec, skipped=skipped))
        (line,) = [e for e in d.causes[0].evidence if "the line is not known" in e]
        assert said in line, line
        assert ("install py-spy" in line) == ("install py-spy" in said), line
