"""Issue 19 on synthetic recordings built from the figures measured on the H200: a ResNet-50
starved by two DataLoader workers (7 % utilization, the loaders at 100 % of a core each, the
main thread waiting), a loop sleeping for its data, the training thread preparing batches
itself, a loader waiting on storage; a spinning kernel (NVML utilization 100 %, GPM SM
activity 0.0076, DRAM 4e-6, tensor 0, 123 W of 700, idle 80 W) beside healthy compute, and
the same stall without GPM as DGX Spark owners report a hung NCCL (about 96 % at 16-27 W
against 45 W healthy); kernels that keep few SMs busy. Each must get its cause, its share
close to what was built in, evidence with its figures, and advice in the order the evidence
suggests; near misses get none."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sparkdiag.watch.diagnose import diagnose
from sparkdiag.watch.model import GpuInfo, ProcessLoad, Recording
from sparkdiag.watch.render import headline, text
from tests.support.watch import F, const, during, names, periodic, share, sole_cause, timeline

MAIN = ProcessLoad(547, "python3", 0.12, 0.0, on_gpu=True)


def workers(cpu: float, n: int = 2, read: float = 0.0) -> tuple[ProcessLoad, ...]:
    """``n`` DataLoader worker processes at ``cpu`` cores each, beside the main process."""
    return (MAIN, *(ProcessLoad(600 + k, "pt_data_worker", cpu, read) for k in range(n)))


def resnet_starved(job_cpus: int | None = 16) -> Recording:
    # 277 images/s against 3783 with the batch on the GPU: 93 % of the time lost to input
    return timeline(
        util=const(0.07),
        sm=const(0.065),
        tensor=const(0.04),
        dram=const(0.02),
        power=const(140.0),
        thread=const(0.04),
        read=const(2e5),
        cpu=const(2.1),
        loads=lambda i: workers(1.0),
        warmup=8,
        teardown=2,
        job_cpus=job_cpus,
    )


def test_resnet_starved_by_two_loaders_at_seven_percent() -> None:
    d = diagnose(resnet_starved())
    assert d.verdict == "input-starved", d.notes
    sole_cause(d, "input-starved", 1 - 277 / 3783, within=0.03)
    assert d.window == (8 * 0.5, (8 + 80) * 0.5)  # from its first kernels, not at 20 %
    evidence = " ".join(d.causes[0].evidence)
    assert "2 loader processes (pt_data_worker) at 100 %, 100 % of a core" in evidence
    assert "each busy all the time" in evidence
    assert "'python3' at 4 % of a core: waiting for its batches" in evidence
    assert "the job used 2.1 of the 16 CPUs" in evidence
    first, second, third = d.causes[0].actions
    assert "num_workers=15," in first and "14 of the 16 CPUs the job may use were idle" in first
    assert "keep up with about 29 workers" in first  # 2 loaders feed 7 %: 2 / 0.07 = 28.6
    assert "on the GPU" in second and "pin_memory=True" in third


def test_loaders_without_cpus_to_spare_move_the_work_to_the_gpu_first() -> None:
    d = diagnose(resnet_starved(job_cpus=2))
    actions = d.causes[0].actions
    assert "on the GPU" in actions[0] and "more CPUs" in actions[1]
    assert not any("num_workers=" in a for a in actions)


def test_a_loop_sleeping_for_its_data_under_twenty_percent() -> None:
    """A step of 17 ms, then 100 ms asleep waiting for data: 14 % utilization, nobody busy."""
    rec = timeline(
        util=const(0.14), sm=const(0.12), tensor=const(0.09), thread=const(0.03),
        read=0.0, cpu=const(0.15), loads=lambda i: (MAIN,), warmup=6,
    )  # fmt: skip
    cause = sole_cause(diagnose(rec), "input-starved", 0.86)
    assert "nobody in the job was busy" in " ".join(cause.evidence)
    assert cause.actions[0].startswith("find what the job waits for: py-spy dump")


def test_the_training_thread_preparing_batches_itself() -> None:
    """num_workers=0: the main thread at 100 % of a core, big kernels (SMs 22 % active at 25 %
    utilization) between batches: data it prepares itself, not a launcher, and without stacks
    the report says it cannot tell that from other host work in the loop."""
    rec = timeline(util=const(0.25), sm=const(0.22), tensor=const(0.15), thread=const(1.0))
    cause = sole_cause(diagnose(rec), "data-prep-in-loop", 0.75)
    evidence = " ".join(cause.evidence)
    assert "prepared data (or ran other host code) itself" in evidence
    assert "cannot be told from other host work" in evidence and "py-spy" in evidence
    assert cause.actions[0].startswith("prepare batches in DataLoader worker processes")


def test_loaders_waiting_on_storage() -> None:
    rec = timeline(
        util=const(0.3), sm=const(0.27), thread=const(0.05), read=const(3e8),
        io_stall=const(0.35), loads=lambda i: workers(0.2, n=4, read=7.5e7), job_cpus=16,
    )  # fmt: skip
    cause = sole_cause(diagnose(rec), "input-starved")
    evidence = " ".join(cause.evidence)
    assert "the job read 300.0 MB/s" in evidence and "stalled on I/O 35 %" in evidence
    assert cause.actions[0].startswith("read faster")


# ---- the stalled kernel -------------------------------------------------------------------------

SPIN = periodic(8, 14)  # 6 ticks of 14... of every 20: a 3 s spin every 10 s


def spinning(**series: Any) -> Recording:
    """Healthy bf16 compute (650 W), and every 10 s a 3 s spin as measured on the H200."""
    args: dict[str, Any] = dict(
        util=during(SPIN, 1.0, 0.99),
        sm=during(SPIN, 0.0076, 0.9),
        dram=during(SPIN, 4e-6, 0.3),
        tensor=during(SPIN, 0.0, 0.7),
        power=during(SPIN, 123.0, 650.0),
        thread=const(1.0),  # cudaDeviceSynchronize spin-waits: a hot host thread throughout
        warmup=6,
    )
    args.update(series)
    return timeline(**args)


def test_a_spinning_kernel_is_a_stall_not_a_launcher() -> None:
    d = diagnose(spinning())
    assert d.verdict == "stalled-kernel", [(c.name, round(c.share, 3)) for c in d.causes]
    evidence = " ".join(sole_cause(d, "stalled-kernel", 0.3, within=0.02).evidence)
    assert "busy 100 % (NVML utilization) for 12.0 s" in evidence
    assert "SM activity 0.76 %, DRAM 0.0004 %, tensor pipes 0 %" in evidence
    assert "power 123 W of 700, against 650 W while the job computed and 80 W idle" in evidence
    assert "spinning while it waits for the GPU" in evidence
    assert "4 stretches, the longest 3.0 s" in evidence
    actions = " ".join(d.causes[0].actions)
    assert "NCCL_DEBUG=INFO" in actions and "timeout=" in actions and "peer" in actions
    assert headline(d) == "stalled kernel (30 % of the time lost)"


def test_a_hang_from_the_start_is_one_long_stall() -> None:
    d = diagnose(spinning(util=const(1.0), sm=const(0.0076), dram=const(4e-6),
                          tensor=0.0, power=const(123.0)))  # fmt: skip
    assert d.verdict == "stalled-kernel" and share(d, "stalled-kernel") == pytest.approx(1.0)
    assert "one stretch of 40.0 s" in " ".join(d.causes[0].evidence)


def test_a_hung_collective_without_gpm_from_utilization_memory_and_power() -> None:
    """DGX Spark: 96 % utilization, memory utilization 0, 20 W against 45 W healthy, no power
    limit to read, no GPM."""
    gb10 = GpuInfo(0, "NVIDIA GB10", "GPU-gb10", "unified")
    rec = timeline(
        util=during(SPIN, 0.96, 0.98), sm=None, tensor=None, dram=None,
        memory_util=during(SPIN, 0.0, 0.35), power=during(SPIN, 20.0, 45.0),
        power_limit=None, idle_power=11.0, thread=const(1.0), gpus=(gb10,), warmup=4,
    )  # fmt: skip
    evidence = " ".join(sole_cause(diagnose(rec), "stalled-kernel").evidence)
    assert "memory utilization 0 % (no GPM here" in evidence
    assert "power 20 W, against 45 W while the job computed and 11 W idle" in evidence
    # the same ticks at full power are a busy kernel with no memory traffic, not a stall
    busy = timeline(
        util=const(0.96), sm=None, tensor=None, dram=None, memory_util=0.0,
        power=const(45.0), power_limit=None, idle_power=11.0, gpus=(gb10,), warmup=4,
    )  # fmt: skip
    assert "stalled-kernel" not in names(diagnose(busy))


def test_one_tick_with_the_stall_signature_is_not_reported() -> None:
    d = diagnose(spinning(util=const(0.99), sm=lambda i: 0.0076 if i == 30 else 0.9,
                          dram=lambda i: 0.0 if i == 30 else 0.3, tensor=const(0.7),
                          power=const(650.0)))  # fmt: skip
    assert d.verdict == "healthy", [(c.name, round(c.share, 3)) for c in d.causes]


# ---- few SMs busy -------------------------------------------------------------------------------


def test_kernels_that_keep_few_sms_busy_are_their_own_finding() -> None:
    """A batch too small for the GPU: a kernel always running (99 %), SMs 12 % active, DRAM and
    tensor pipes working, the host thread spin-waiting."""
    rec = timeline(util=const(0.99), sm=const(0.12), dram=const(0.35), tensor=const(0.05))
    d = diagnose(rec)
    cause = sole_cause(d, "few-sms", 0.87)
    assert not cause.lost
    assert "kept SMs only 12 % active, while DRAM was 35 % and tensor pipes 5 %" in " ".join(
        cause.evidence
    )
    report = text(rec, d)
    assert "87 % of the time SMs sat idle while kernels ran" in report
    assert "of the time lost" not in report


def test_busy_kernels_filling_the_gpu_are_not_few_sms() -> None:
    rec = timeline(util=const(0.99), sm=const(0.45), dram=const(0.5), tensor=const(0.3))
    assert diagnose(rec).verdict == "healthy"


def test_a_stall_that_begins_and_ends_inside_ticks_counts_those_halves() -> None:
    """1.5 s of spin in every 3.5 s, not aligned with the 0.5 s ticks: half a tick, two whole
    ones, half a tick (SMs at half the job's computing level in the halves). The truth is
    1.5 / 3.5; the whole ticks alone would give 1.0 / 3.5."""

    def phase(i: int) -> str:
        return {0: "half", 1: "spin", 2: "spin", 3: "half"}.get(i % 7, "compute")

    def by_phase(spin: float, half: float, compute: float) -> F:
        return lambda i: {"spin": spin, "half": half, "compute": compute}[phase(i)]

    rec = timeline(
        n=70, util=by_phase(1.0, 1.0, 0.99), sm=by_phase(0.0076, 0.45, 0.9),
        dram=by_phase(4e-6, 0.15, 0.3), tensor=by_phase(0.0, 0.35, 0.7),
        power=by_phase(123.0, 390.0, 650.0), thread=const(1.0), warmup=4,
    )  # fmt: skip
    d = diagnose(rec)
    sole_cause(d, "stalled-kernel", 1.5 / 3.5, within=0.02)


@pytest.mark.parametrize("scope", ["host", "shared-cgroup", "cgroup"])
def test_the_host_s_io_pressure_is_not_the_input_of_a_job_that_reads_nothing(scope: str) -> None:
    """A job waiting on something else (reading nothing) while the host's tasks stall on I/O
    88 % of the time: PSI of the host is another's (seen under a parallel test run: "read
    faster" for a job that read 0 B/s), and so is PSI of a cgroup that other processes share
    (a container's, seen on the lent H100 the same way); PSI of the job's own cgroup is still
    its own."""
    rec = replace(
        timeline(util=const(0.3), sm=const(0.27), thread=const(0.0), read=const(0.0),
                 io_stall=const(0.88), job_cpus=2),
        pressure_scope=scope,
    )  # fmt: skip
    cause = sole_cause(diagnose(rec), "input-starved")
    evidence = " ".join(cause.evidence)
    if scope != "cgroup":
        whose = {"host": "the whole host", "shared-cgroup": "a cgroup the job shares with other"}
        assert f"stalled on I/O 88 % of the time (PSI of {whose[scope]}" in evidence
        assert "nobody in the job was busy" in evidence
        assert cause.actions[0].startswith("find what the job waits for")
    else:
        assert "read 0 B/s (median), tasks stalled on I/O 88 %" in evidence
        assert cause.actions[0].startswith("read faster")
