"""Activity, interconnect and per-process readings: the GPU source over the derived two-H200
NVLink fixture, the real backend's delta bookkeeping (GPM, sample buffers) over a fake pynvml,
the recorder's priming of delta queries, and the exporter's series."""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sparkdiag.exporter.registry import build_registry
from sparkdiag.snapshot import ProcessIdentity, Snapshot
from sparkdiag.sources.host.procfs import ProcessIdentities
from sparkdiag.sources.nvml.activity import ProcessOptions
from sparkdiag.sources.nvml.api import NOT_FOUND, NOT_READY, NOT_SUPPORTED, NvmlCallError
from sparkdiag.sources.nvml.calls import NvmlCalls
from sparkdiag.sources.nvml.fixture import FixtureBackend
from sparkdiag.sources.nvml.gpu import GpuSource
from sparkdiag.sources.nvml.queries import CATALOGUE, DELTA_QUERIES
from sparkdiag.sources.nvml.record import record
from sparkdiag.telemetry.poller import Poller
from tests.support import CountingBackend

ROOTFS = Path(__file__).parent / "fixtures" / "rootfs" / "gpu-host"
GPU0 = {"gpu": "0", "uuid": "GPU-979ad365-0b73-a0ac-74a2-3520b773d4c0"}
GPU1 = {"gpu": "1", "uuid": "GPU-979ad365-0b73-a0ac-74a2-3520b773d4c1"}
DOCKER = "4c1d5e2f9a7b3c8d0e6f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"
K8S = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"
POD = "3f2e1d0c-b9a8-4f7e-8d6c-5b4a39281706"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _source(
    nvml_fixture: Callable[[str], Path],
    name: str = "h200-x2-nvlink",
    top: int | None = 10,
    clock: Clock | None = None,
) -> tuple[GpuSource, CountingBackend]:
    backend = CountingBackend(nvml_fixture(name))
    options = None if top is None else ProcessOptions(top, ProcessIdentities(ROOTFS))
    source = GpuSource(backend, clock=clock or Clock(), processes=options)
    assert source.start()
    return source, backend


# ---- the GPU source -----------------------------------------------------------------------------


def test_activity_video_and_pcie_throughput(nvml_fixture: Callable[[str], Path]) -> None:
    source, _ = _source(nvml_fixture)
    gpu0, gpu1 = source.read()
    assert gpu0.activity_ratio == {"sm": 0.935, "tensor": 0.718, "dram": 0.384}
    assert gpu0.sm_occupancy_ratio == pytest.approx(0.462)
    assert gpu0.video_utilization_ratio == {"encoder": 0.0, "decoder": 0.0}
    # KB/s as NVML reports them (KiB), in bytes per second
    assert gpu0.pcie_throughput_bytes_per_second == {"tx": 412000 * 1024.0, "rx": 1730000 * 1024.0}
    assert gpu1.activity_ratio["sm"] == 0.935


def test_nvlinks_per_link(nvml_fixture: Callable[[str], Path]) -> None:
    source, _ = _source(nvml_fixture)
    gpu0 = source.read()[0]
    assert [link.link for link in gpu0.nvlinks] == list(range(18))
    assert all(link.up for link in gpu0.nvlinks)
    link3 = gpu0.nvlinks[3]
    assert link3.errors == {"replay": 0.0, "recovery": 0.0, "crc_flit": 0.0, "crc_data": 0.0}
    assert link3.data_bytes == {
        "tx": (1200000000 + 3000) * 1024.0,
        "rx": (1200000000 + 1500) * 1024.0,
    }


def test_recorded_h200_without_the_new_answers_reports_none_of_them(
    nvml_fixture: Callable[[str], Path],
) -> None:
    """The 2026-11-29 recording predates these queries: every one is unsupported there, so the
    sample leaves them out (no activity, no NVLink), never 0."""
    source, backend = _source(nvml_fixture, "h200-idle-2026-11-29")
    sample = source.read()[0]
    assert sample.activity_ratio == {} and sample.sm_occupancy_ratio is None
    assert sample.nvlinks == () and sample.pcie_throughput_bytes_per_second == {}
    assert sample.video_utilization_ratio == {}
    assert sample.processes == () and sample.processes_unseen == 0
    # unsupported answers are remembered: a second read asks none of the 18 links again
    backend.asked.clear()
    source.read()
    assert not [key for key in backend.asked if key[1].startswith("nvlink")]


def test_recorded_h200_under_load_reports_its_activity(
    nvml_fixture: Callable[[str], Path],
) -> None:
    """The 2026-12-01 recording after 20 s of bf16 matmuls: GPM, PCIe throughput, video engines
    and the one compute process as the H200 answered; its NVLink queries answered NOT_SUPPORTED
    (a single PCIe H200), so no link is reported and none is asked again."""
    source, backend = _source(nvml_fixture, "h200-load")
    sample = source.read()[0]
    assert sample.activity_ratio == {
        "sm": pytest.approx(0.9625, abs=1e-4),
        "tensor": pytest.approx(0.9342, abs=1e-4),
        "dram": pytest.approx(0.1748, abs=1e-4),
    }
    assert sample.sm_occupancy_ratio == pytest.approx(0.1422, abs=1e-4)
    assert sample.video_utilization_ratio == {"encoder": 0.0, "decoder": 0.0}
    assert sample.pcie_throughput_bytes_per_second == {"tx": 7273 * 1024.0, "rx": 15947 * 1024.0}
    assert sample.nvlinks == ()
    assert sample.processes is not None
    (process,) = sample.processes
    assert process.pid == 547 and process.used_memory_bytes == 1050673152.0
    assert process.sm_utilization_ratio == 0.99
    backend.asked.clear()
    source.read()
    assert not [key for key in backend.asked if key[1].startswith("nvlink")]


def test_recorded_h200_idle_reports_idle_activity(nvml_fixture: Callable[[str], Path]) -> None:
    """Idle, the recording's GPM answers are 0 (DRAM a trace), not absent: the H200 has GPM."""
    source, _ = _source(nvml_fixture, "h200-idle")
    sample = source.read()[0]
    assert sample.activity_ratio["sm"] == 0.0 and sample.activity_ratio["tensor"] == 0.0
    assert 0.0 < sample.activity_ratio["dram"] < 1e-5
    assert sample.sm_occupancy_ratio == 0.0
    assert sample.pcie_throughput_bytes_per_second == {"tx": 1587 * 1024.0, "rx": 595 * 1024.0}
    assert sample.processes == () and sample.nvlinks == ()


def test_unified_memory_gpu_has_no_nvml_pcie_throughput(
    derive_fixture: Callable[..., Path],
) -> None:
    path = derive_fixture(
        "gb10-idle", devices=[{"from": 0, "set": {"pcie_throughput/0": 5, "pcie_throughput/1": 5}}]
    )
    source = GpuSource(FixtureBackend(path))
    assert source.start()
    assert source.read()[0].pcie_throughput_bytes_per_second == {}


GPM_WITH_PCIE = {"sm": 40.0, "sm_occupancy": 20.0, "tensor": 30.0, "dram": 10.0,
                 "pcie_tx": 1308.0, "pcie_rx": 3142.0}  # fmt: skip


def test_pcie_throughput_comes_from_gpm_where_it_answers_and_nvml_s_query_is_not_asked(
    derive_fixture: Callable[..., Path],
) -> None:
    """GPM's PCIe counters (MiB/s between two polls; the H200 read rx 3142 under a pageable
    host-to-device loop): NVML's own query, which blocks 20 ms a direction, is not asked."""
    path = derive_fixture("h200-idle", devices=[{"from": 0, "set": {"gpm": GPM_WITH_PCIE}}])
    backend = CountingBackend(path)
    source = GpuSource(backend)
    assert source.start()
    sample = source.read()[0]
    mib = 1024.0 * 1024.0
    assert sample.pcie_throughput_bytes_per_second == {"tx": 1308 * mib, "rx": 3142 * mib}
    assert sample.activity_ratio == {"sm": 0.4, "tensor": 0.3, "dram": 0.1}
    assert backend.asked[(0, "gpm", None)] == 1  # one sample a poll, for both
    assert (0, "pcie_throughput", 0) not in backend.asked
    assert (0, "pcie_throughput", 1) not in backend.asked


@pytest.mark.parametrize(
    ("base", "gpm", "expected"),
    [  # GPM with one direction only: NVML's window for both; unified memory: neither
        ("h200-idle", {"sm": 1.0, "pcie_tx": 5.0}, {"tx": 1587 * 1024.0, "rx": 595 * 1024.0}),
        ("gb10-idle", GPM_WITH_PCIE, {}),
    ],
)
def test_without_both_gpm_directions_nvml_s_window_and_never_on_unified_memory(
    derive_fixture: Callable[..., Path], base: str, gpm: dict[str, float], expected: object
) -> None:
    path = derive_fixture(base, devices=[{"from": 0, "set": {"gpm": gpm}}])
    source = GpuSource(FixtureBackend(path))
    assert source.start()
    assert source.read()[0].pcie_throughput_bytes_per_second == expected


def test_slow_tier_reads_pcie_throughput_and_nvlink_every_10_seconds(
    nvml_fixture: Callable[[str], Path],
) -> None:
    clock = Clock()
    source, backend = _source(nvml_fixture, clock=clock)
    for _ in range(5):  # five polls within 4 seconds
        source.read()
        clock.now += 1.0
    assert backend.asked[(0, "pcie_throughput", 0)] == 1
    assert backend.asked[(0, "nvlink_state", 5)] == 1
    assert backend.asked[(0, "nvlink_crc_flit_errors", 5)] == 1
    assert backend.asked[(0, "process_utilization", None)] == 1
    assert backend.asked[(0, "gpm", None)] == 5  # activity: every poll
    clock.now += 10.0
    source.read()
    assert backend.asked[(0, "pcie_throughput", 0)] == 2


def test_processes_with_identities_top_n_and_unseen(
    nvml_fixture: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    source, _ = _source(nvml_fixture)
    gpu0, gpu1 = source.read()
    assert gpu0.processes is not None and gpu1.processes is not None
    by_pid = {p.pid: p for p in gpu0.processes}
    assert [p.pid for p in gpu0.processes] == [4242, 5151, 7171]  # by used memory
    assert by_pid[4242].identity == ProcessIdentity("python3", "alice", DOCKER, "")
    assert by_pid[5151].identity == ProcessIdentity("pt_main_thread", "root", K8S, POD)
    assert by_pid[7171].identity is None  # another PID namespace
    assert by_pid[4242].used_memory_bytes == 81604378624.0
    assert by_pid[4242].sm_utilization_ratio == 0.88
    assert by_pid[7171].sm_utilization_ratio is None  # no sample: left out, not 0
    assert gpu0.processes_unseen == 1
    assert gpu1.processes_unseen == 0
    assert gpu1.processes[1].identity == ProcessIdentity("llama-server", "bob", "", "")
    unseen_lines = [r for r in caplog.records if "does not show" in r.getMessage()]
    assert len(unseen_lines) == 1 and "--pid=host" in unseen_lines[0].getMessage()
    source.read()
    assert len([r for r in caplog.records if "does not show" in r.getMessage()]) == 1


def test_top_n_keeps_the_processes_using_most_memory(nvml_fixture: Callable[[str], Path]) -> None:
    source, _ = _source(nvml_fixture, top=1)
    gpu0 = source.read()[0]
    assert gpu0.processes is not None
    assert [p.pid for p in gpu0.processes] == [4242]
    assert gpu0.processes_unseen == 1  # counted over every listed process, not only the top


def test_process_metrics_off_asks_nothing_per_process(nvml_fixture: Callable[[str], Path]) -> None:
    source, backend = _source(nvml_fixture, top=None)
    gpu0 = source.read()[0]
    assert gpu0.processes is None and gpu0.processes_unseen is None
    assert backend.asked[(0, "process_utilization", None)] == 0


# ---- the exporter -------------------------------------------------------------------------------


def _snapshot(source: GpuSource, excluded: frozenset[int] = frozenset()) -> Snapshot:
    poller = Poller(source, None, None, None, excluded_pids=lambda: excluded)
    return poller.poll_once()


def _registry(snapshot: Snapshot) -> CollectorRegistry:
    return build_registry(lambda: snapshot)


def test_exported_activity_and_interconnect_series(nvml_fixture: Callable[[str], Path]) -> None:
    source, _ = _source(nvml_fixture)
    reg = _registry(_snapshot(source))
    get = reg.get_sample_value
    assert get("sparkdiag_gpu_activity_ratio", {**GPU0, "engine": "tensor"}) == 0.718
    assert get("sparkdiag_gpu_sm_occupancy_ratio", GPU1) == pytest.approx(0.462)
    assert get("sparkdiag_gpu_video_utilization_ratio", {**GPU0, "engine": "encoder"}) == 0.0
    tx = get("sparkdiag_gpu_pcie_throughput_bytes_per_second", {**GPU0, "direction": "tx"})
    assert tx == 412000 * 1024.0
    assert get("sparkdiag_gpu_nvlink_up", {**GPU1, "link": "17"}) == 1
    errors = get("sparkdiag_gpu_nvlink_errors_total", {**GPU0, "link": "2", "type": "replay"})
    assert errors == 0
    rx = get("sparkdiag_gpu_nvlink_data_bytes_total", {**GPU0, "link": "1", "direction": "rx"})
    assert rx == (1200000000 + 500) * 1024.0


def test_exported_process_series_and_exclusions(nvml_fixture: Callable[[str], Path]) -> None:
    source, _ = _source(nvml_fixture)
    reg = _registry(_snapshot(source, excluded=frozenset({6161})))
    labels = {
        **GPU0,
        "pid": "5151",
        "process": "pt_main_thread",
        "user": "root",
        "container_id": K8S,
        "pod_uid": POD,
    }
    assert reg.get_sample_value("sparkdiag_gpu_process_memory_bytes", labels) == 21474836480.0
    assert reg.get_sample_value("sparkdiag_gpu_process_sm_utilization_ratio", labels) == 0.09
    hidden = {**GPU0, "pid": "7171", "process": "", "user": "", "container_id": "", "pod_uid": ""}
    assert reg.get_sample_value("sparkdiag_gpu_process_memory_bytes", hidden) == 1073741824.0
    assert reg.get_sample_value("sparkdiag_gpu_compute_processes_unseen", GPU0) == 1
    # sparkdiag's own pid (a probe worker) is left out
    pids = {
        s.labels["pid"]
        for fam in reg.collect()
        if fam.name == "sparkdiag_gpu_process_memory_bytes"
        for s in fam.samples
    }
    assert pids == {"4242", "5151", "7171"}


def test_series_of_a_process_that_ended_disappear(derive_fixture: Callable[..., Path]) -> None:
    path = derive_fixture(
        "h200-x2-nvlink",
        script=[
            {
                "poll": 2,
                "gpu": 0,
                "set": {"compute_processes": [{"pid": 4242, "used_memory": 5}]},
            }
        ],
    )
    source = GpuSource(
        FixtureBackend(path), processes=ProcessOptions(10, ProcessIdentities(ROOTFS))
    )
    assert source.start()
    poller = Poller(source, None, None, None)
    first = _registry(poller.poll_once())
    labels = {
        **GPU0,
        "pid": "5151",
        "process": "pt_main_thread",
        "user": "root",
        "container_id": K8S,
        "pod_uid": POD,
    }
    assert first.get_sample_value("sparkdiag_gpu_process_memory_bytes", labels) is not None
    second = _registry(poller.poll_once())
    assert second.get_sample_value("sparkdiag_gpu_process_memory_bytes", labels) is None


def test_no_process_series_without_the_option(nvml_fixture: Callable[[str], Path]) -> None:
    source, _ = _source(nvml_fixture, top=None)
    reg = _registry(_snapshot(source))
    names = {fam.name for fam in reg.collect()}
    assert "sparkdiag_gpu_process_memory_bytes" not in names
    assert "sparkdiag_gpu_compute_processes_unseen" not in names


# ---- the real backend's bookkeeping, over a fake pynvml -----------------------------------------


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class _Metric(ctypes.Structure):
    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
    ]


class _MetricsGet(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.c_void_p),
        ("sample2", ctypes.c_void_p),
        ("metrics", _Metric * 16),
    ]


class _Sample:
    def __init__(self, stamp: int, value: float) -> None:
        self.timeStamp = stamp
        self.sampleValue = type("V", (), {"uiVal": int(value)})()


class _ProcSample:
    def __init__(self, pid: int, stamp: int, sm: int) -> None:
        self.pid, self.timeStamp, self.smUtil = pid, stamp, sm
        self.memUtil = self.encUtil = self.decUtil = 0


class FakeNvml:
    """The pynvml calls NvmlCalls makes for the activity block, with a scripted GPU: GPM values
    per sample pair, a driver sample buffer, and per-process samples."""

    NVMLError = FakeNvmlError
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = _MetricsGet

    def __init__(self, gpm_supported: bool = True) -> None:
        self.gpm_supported = gpm_supported
        self.samples_taken = 0
        self.allocated: list[int] = []
        self.freed: list[int] = []
        self.buffer: list[_Sample] = []
        self.proc_buffer: list[_ProcSample] = []
        self.pairs: list[tuple[int, int]] = []

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        return type("S", (), {"isSupportedDevice": int(self.gpm_supported)})()

    def nvmlGpmSampleAlloc(self) -> int:
        self.allocated.append(100 + len(self.allocated))
        return self.allocated[-1]

    def nvmlGpmSampleFree(self, sample: int) -> None:
        self.freed.append(sample)

    def nvmlGpmSampleGet(self, handle: Any, sample: int) -> int:
        self.samples_taken += 1
        return sample

    def nvmlGpmMetricsGet(self, request: _MetricsGet) -> _MetricsGet:
        self.pairs.append((int(request.sample1), int(request.sample2)))
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            metric.value = 10.0 * self.samples_taken + metric.metricId
            metric.nvmlReturn = 3 if metric.metricId == 10 else 0  # DRAM: not supported here
        return request

    def nvmlDeviceGetSamples(self, handle: Any, kind: int, since: int) -> tuple[int, list[_Sample]]:
        found = [s for s in self.buffer if s.timeStamp > since]
        if not found:
            raise FakeNvmlError(NOT_FOUND)
        return 1, found

    def nvmlDeviceGetProcessUtilization(self, handle: Any, since: int) -> Sequence[_ProcSample]:
        found = [s for s in self.proc_buffer if s.timeStamp > since]
        if not found:
            raise FakeNvmlError(NOT_FOUND)
        return found


HANDLE = ctypes.c_void_p(0x1234)


def test_gpm_first_call_is_not_ready_then_ratios_between_consecutive_samples() -> None:
    nv = FakeNvml()
    calls = NvmlCalls(nv)
    with pytest.raises(NvmlCallError) as first:
        calls.gpm(HANDLE)
    assert first.value.code == NOT_READY
    second = calls.gpm(HANDLE)
    # metric id + 10 x samples taken; DRAM answered NOT_SUPPORTED and is left out
    assert second == {
        "sm": 22.0,
        "sm_occupancy": 23.0,
        "tensor": 25.0,
        "pcie_tx": 40.0,
        "pcie_rx": 41.0,
    }
    third = calls.gpm(HANDLE)
    assert third["sm"] == 32.0
    # each comparison is (previous sample, this one): the two buffers alternate
    assert nv.pairs == [(101, 100), (100, 101)]
    calls.close()
    assert sorted(nv.freed) == [100, 101]


def test_gpm_unsupported_device() -> None:
    calls = NvmlCalls(FakeNvml(gpm_supported=False))
    with pytest.raises(NvmlCallError) as err:
        calls.gpm(HANDLE)
    assert err.value.code == NOT_SUPPORTED


def test_driver_samples_are_returned_once_and_none_is_empty() -> None:
    nv = FakeNvml()
    calls = NvmlCalls(nv)
    assert calls.utilization_samples(HANDLE) == []  # NOT_FOUND: no sample yet
    nv.buffer = [_Sample(1_000, 40), _Sample(2_000, 60)]
    assert calls.utilization_samples(HANDLE) == [[1000, 40.0], [2000, 60.0]]
    nv.buffer.append(_Sample(3_000, 100))
    assert calls.utilization_samples(HANDLE) == [[3000, 100.0]]


def test_process_utilization_is_averaged_per_pid_since_the_last_call() -> None:
    nv = FakeNvml()
    calls = NvmlCalls(nv)
    assert calls.process_utilization(HANDLE) == []
    nv.proc_buffer = [_ProcSample(7, 10, 50), _ProcSample(7, 20, 70), _ProcSample(9, 20, 5)]
    answer = calls.process_utilization(HANDLE)
    assert [(a["pid"], a["sm"]) for a in answer] == [(7, 60.0), (9, 5.0)]
    assert calls.process_utilization(HANDLE) == []  # nothing newer


# ---- the catalogue and the recorder -------------------------------------------------------------


def test_the_delta_queries_are_the_ones_that_answer_since_the_previous_call() -> None:
    assert {"gpm", "utilization_samples", "process_utilization"} == DELTA_QUERIES
    assert len(CATALOGUE["nvlink_state"].arguments()) == 18


class _DeltaBackend(FixtureBackend):
    """Answers delta queries NOT_READY at their first call, like GPM on the real backend."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: Counter[str] = Counter()

    def query(self, index: int, query: str, arg: int | None = None) -> Any:
        if query in DELTA_QUERIES:
            self.calls[query] += 1
            if self.calls[query] == 1:
                raise NvmlCallError(NOT_READY)
        return super().query(index, query, arg)


def test_recorder_primes_delta_queries_and_records_the_second_answer(
    nvml_fixture: Callable[[str], Path],
) -> None:
    backend = _DeltaBackend(nvml_fixture("h200-x2-nvlink"))
    slept: list[float] = []
    doc = record(backend, sleep=slept.append)
    answers = doc["devices"][0]["answers"]
    assert answers["gpm"] == {"sm": 93.5, "sm_occupancy": 46.2, "tensor": 71.8, "dram": 38.4}
    assert answers["nvlink_state/17"] == 1
    assert answers["pcie_throughput/1"] == 1730000
    assert slept == [0.5]


class _Field:
    def __init__(self, field: int, link: int, code: int) -> None:
        self.nvmlReturn = code
        self.valueType = 3  # unsigned long long
        self.value = type("V", (), {"ullVal": field * 1000 + link})()


class FieldNvml(FakeNvml):
    def __init__(self) -> None:
        super().__init__()
        self.field_calls = 0

    def nvmlDeviceGetFieldValues(self, handle: Any, wanted: list[tuple[int, int]]) -> list[_Field]:
        self.field_calls += 1
        return [_Field(f, link, NOT_SUPPORTED if link == 17 else 0) for f, link in wanted]


def test_nvlink_data_of_every_link_comes_from_one_field_values_call() -> None:
    nv = FieldNvml()
    calls = NvmlCalls(nv)
    assert CATALOGUE["nvlink_tx_kib"].call(calls, HANDLE, 3) == 138 * 1000 + 3
    assert CATALOGUE["nvlink_rx_kib"].call(calls, HANDLE, 16) == 139 * 1000 + 16
    with pytest.raises(NvmlCallError) as err:
        CATALOGUE["nvlink_tx_kib"].call(calls, HANDLE, 17)  # a link without the field
    assert err.value.code == NOT_SUPPORTED
    assert nv.field_calls == 1


def test_gb10_per_process_memory_is_its_only_gpu_memory_figure(
    derive_fixture: Callable[..., Path],
) -> None:
    """Unified memory: no framebuffer figures, but the processes' used memory is exported."""
    path = derive_fixture(
        "gb10-idle",
        devices=[
            {"from": 0, "set": {"compute_processes": [{"pid": 6161, "used_memory": 42 << 30}]}}
        ],
    )
    source = GpuSource(
        FixtureBackend(path), processes=ProcessOptions(10, ProcessIdentities(ROOTFS))
    )
    assert source.start()
    reg = _registry(_snapshot(source))
    gb10 = {"gpu": "0", "uuid": "GPU-5b4c1f0e-6a2d-4e8b-9c31-0d2e7f6a9b10"}
    assert reg.get_sample_value("sparkdiag_gpu_memory_bytes", {**gb10, "state": "used"}) is None
    labels = {
        **gb10,
        "pid": "6161",
        "process": "llama-server",
        "user": "bob",
        "container_id": "",
        "pod_uid": "",
    }
    assert reg.get_sample_value("sparkdiag_gpu_process_memory_bytes", labels) == float(42 << 30)
