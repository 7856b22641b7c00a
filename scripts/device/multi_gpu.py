#!/usr/bin/env python3
"""Several GPUs for real (issue 33): NVLink, peers, a hung collective and a straggler.

On a machine of N >= 2 GPUs (N read at run time), in one call bounded by ``--budget``:

  1 record   ``sparkdiag record-fixture`` of the idle machine (and, in step 3, under the
             all-reduce), nvidia-smi's NVLink state, errors, counters, topology and ``-q``, the
             PCI functions in sysfs as a fake tree (what the golden tests' fixtures are made of)
  2 peers    ``check`` idle (the node comparison on real probes); a co-tenant (bf16 matmul loop)
             on GPU ``--slow-gpu``; ``check`` again; ``serve`` on every GPU probing once with
             ``--probe.when always`` under a real Prometheus whose SparkdiagGpuSlowerThanPeers
             ``for:`` is shortened: it must fire for that GPU alone (it judges groups of 4 or
             more; with 2 or 3 GPUs the daemon's own node ratio must name it instead)
  3 collective  an all-reduce job, one process per GPU (scripts/device/multi_gpu_job.py):
             traffic, then a straggler phase (a co-tenant on ``--straggler-rank``'s GPU), then
             the stop rank leaves the collective; a fresh daemon and Prometheus (the stall
             alert's ``for:`` shortened): SparkdiagGpuStalled on the waiting GPUs only; ``watch
             --json`` (with py-spy stacks) over the straggler phase and over the hang; ``check
             --quick`` during the hang
  4 nvlink   the NVLink payload the daemon exported between a scrape before the traffic and one
             during the hang (when nothing moves) against ``nvidia-smi nvlink -gt d`` read at the
             same moments, and against the bytes the job's all-reduces should have sent

Everything goes into ONE archive, ``$OUT/multigpu.tgz`` (multigpu/: summary.json, summary.txt,
log, and one file per reading); the table is printed last. One step failing does not stop the
others. Every process started here has NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1
and NVSHMEM_DISABLE_NVLS=1 in its environment. Run through scripts/device/multi_gpu.sh on the
machine; ``--dry`` runs every step on NVML fixtures with CPU torch (gloo) on any machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]
import multi_gpu_read as rd  # noqa: E402
from multi_gpu_job import NO_MULTICAST, SCRIPT, parse_plan  # noqa: E402
from multi_gpu_table import table  # noqa: E402
from prom_session import PromSession, free_port, shorten_for  # noqa: E402

os.environ.update(NO_MULTICAST)
os.environ.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
FIXTURES = ROOT / "tests" / "fixtures"
STEPS = ("record", "peers", "collective")
# Seconds a step needs to be begun, and keeps for itself while the steps before it run (the
# collective's job alone is ~65 s of phases after its start, plus the hang).
NEED = {"record": 20.0, "peers": 90.0, "collective": 150.0}
RESERVE = 15.0  # for stopping everything, the archive and the table


class Stop(Exception):
    """SIGTERM or SIGINT: wrap up (archive, table) with what was measured."""


class Run:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.dry = opts.dry
        self.began = time.monotonic()
        self.deadline = self.began + opts.budget
        self.step_end: float | None = None
        self.work = Path(opts.work) / "multigpu"
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = (self.work / "log.txt").open("a", encoding="utf-8")
        self.children: list[subprocess.Popen[bytes]] = []
        self.summary: dict[str, Any] = {"mode": "dry" if self.dry else "gpu", "budget": opts.budget}
        self.rows: list[dict[str, Any]] = []
        self.fixture = Path(opts.fixture).resolve()
        self.gpus = self._gpus()
        self.n = len(self.gpus)
        self.summary["gpus"] = self.gpus

    # -- plumbing ---------------------------------------------------------------------------

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.began:6.1f}] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def left(self) -> float:
        """Seconds left to the step running now: the budget less the reserve, less what the
        steps after it keep (``step_end``)."""
        end = self.deadline - RESERVE
        if self.step_end is not None:
            end = min(end, self.step_end)
        return end - time.monotonic()

    def row(self, step: str, what: str, seen: str, ok: bool | None) -> None:
        self.rows.append({"step": step, "what": what, "seen": seen, "ok": ok})
        self.say(f"{step}: {what}: {seen} ({'-' if ok is None else 'ok' if ok else 'NOT OK'})")

    def run(self, cmd: list[str], name: str, timeout: float) -> tuple[int, str]:
        """Run ``cmd`` to the end, at most ``timeout`` and the budget (then its whole session is
        killed: a check's probe workers with it); its output into ``name``, its errors, if
        any, into ``name.stderr``; (exit status, output). 124 when it ran out of time."""
        limit = max(1.0, min(timeout, self.left()))
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                                    start_new_session=True)  # fmt: skip
        except OSError as exc:
            rc, out, err = 127, b"", str(exc).encode()
        else:
            try:
                out, err = proc.communicate(timeout=limit)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                rc, err = 124, err + f"\n(killed after {limit:.0f} s)".encode()
            finally:
                if proc.poll() is None:  # Stop came while it ran
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
        (self.work / name).write_bytes(out)
        if err.strip():
            (self.work / f"{name}.stderr").write_bytes(err[-16000:])
        return rc, out.decode(errors="replace")

    def sd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "sparkdiag", *args]

    def start(
        self, cmd: list[str], log: str, err: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in a session of its own (so that :meth:`stop` ends its children too),
        its output into ``log`` (its errors too, unless ``err`` names another file), ``env``
        added to the environment."""
        out = (self.work / log).open("ab")
        errors = (self.work / err).open("ab") if err else subprocess.STDOUT
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=errors,
            cwd=ROOT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        self.children.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes] | None, grace: float = 8.0) -> None:
        """End a child and every process of its session (ranks, workers): TERM, then KILL."""
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def machine(self) -> list[str]:
        """The flags that put a sparkdiag command on the dry run's recorded machine."""
        if not self.dry:
            return []
        sysfs = "h200-x8" if self.n == 8 else "h200-vm"
        return [
            "--path.sysfs",
            str(FIXTURES / "sysfs" / sysfs),
            "--path.rootfs",
            str(FIXTURES / "rootfs" / "native"),
        ]

    def _gpus(self) -> list[dict[str, Any]]:
        if self.dry:
            import multi_gpu_dry

            return multi_gpu_dry.gpus(self.fixture)
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.summary["nvidia_smi_error"] = str(exc)
            return []
        return [
            dict(zip(("index", "uuid", "pci_bus_id", "name"), [int(f[0]), *f[1:]], strict=True))
            for f in (list(map(str.strip, line.split(","))) for line in done.stdout.splitlines())
            if len(f) == 4
        ]

    def cotenant(
        self, gpu: int, log: str, until: float, start_at: float = 0.0
    ) -> subprocess.Popen[bytes]:
        """The co-tenant (bf16 matmuls back to back) on GPU ``gpu`` alone (its uuid the only one
        visible to it), from ``start_at`` to ``until``; on the CPU in a dry run."""
        cmd = [
            sys.executable,
            str(SCRIPT),
            "cotenant",
            "--device",
            "cpu" if self.dry else "cuda:0",
            "--start-at",
            str(start_at),
            "--until",
            str(until),
        ]
        env = {} if self.dry else {"CUDA_VISIBLE_DEVICES": str(self.gpus[gpu]["uuid"])}
        return self.start(cmd, log, env=env)

    def metrics(self, target: str) -> str:
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    def serve(self, name: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
        target = f"127.0.0.1:{free_port()}"
        cmd = self.sd(
            "serve",
            "--listen",
            target,
            "--poll-interval",
            "1",
            "--state-dir",
            str(self.work / f"state-{name}"),
            *self.machine(),
            *extra,
        )
        proc = self.start(cmd, f"serve-{name}.log")
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                self.metrics(target)
                return proc, target
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"serve exited {proc.returncode}: serve-{name}.log"
                    ) from None
                time.sleep(0.3)
        raise TimeoutError(f"serve did not answer in 60 s: serve-{name}.log")

    def rules(self) -> str:
        text = (ROOT / "prometheus" / "sparkdiag-rules.yml").read_text(encoding="utf-8")
        short = shorten_for(
            text,
            {
                "SparkdiagGpuSlowerThanPeers": self.opts.slower_for,
                "SparkdiagGpuStalled": self.opts.stalled_for,
            },
        )
        (self.work / "rules-shortened.yml").write_text(short, encoding="utf-8")
        if self.opts.promtool:
            self.run(
                [self.opts.promtool, "check", "rules", str(self.work / "rules-shortened.yml")],
                "promtool-check-rules.txt",
                60,
            )
        return short

    def firing(self, prom: PromSession, alert: str) -> dict[str, str]:
        """{gpu: state} of ``alert``'s pending and firing instances."""
        return {
            str(a["labels"].get("gpu")): str(a["state"])
            for a in prom.alerts()
            if a["labels"].get("alertname") == alert
        }

    # -- 1. record ----------------------------------------------------------------------------

    def step_record(self) -> None:
        smi = {
            "list": ["-L"],
            "topo": ["topo", "-m"],
            "nvlink-status": ["nvlink", "-s"],
            "nvlink-errors": ["nvlink", "-e"],
            "nvlink-remote": ["nvlink", "-R"],
            "nvlink-throughput": ["nvlink", "-gt", "d"],
            "query": ["-q"],
        }
        for name, args in smi.items():
            if not self.dry:
                self.run(["nvidia-smi", *args], f"nvidia-smi-{name}.txt", 60)
        self.run(
            [
                sys.executable,
                "-c",
                "import torch, platform; print(platform.platform(), "
                "'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', "
                "torch.cuda.nccl.version() if torch.cuda.is_available() else None)",
            ],
            "torch.txt",
            120,
        )
        (self.work / "env.json").write_text(
            json.dumps(
                {
                    k: os.environ.get(k)
                    for k in (*NO_MULTICAST, "CUDA_DEVICE_ORDER", "SPARKDIAG_PYSPY")
                },
                indent=1,
            )
        )
        name = f"h200-x{self.n}-idle.json"
        self.record(name, f"{self.n} GPUs, idle (scripts/device/multi_gpu.py step 1)", self.fixture)
        rows = rd.capture_pci(Path(self.opts.sysfs), self.work / "sysfs")
        (self.work / "pci.tsv").write_text(rd.pci_table(rows), encoding="utf-8")
        on_bus = [
            r
            for r in rows
            if r.get("vendor") == "0x10de" and r.get("class", "")[:6] in ("0x0300", "0x0302")
        ]
        self.row(
            "record",
            "GPU functions in sysfs",
            f"{len(on_bus)} NVIDIA GPU functions, {len(rows)} PCI functions (sysfs/, pci.tsv)",
            None if self.dry else len(on_bus) == self.n,
        )

    def record(self, name: str, description: str, fixture: Path | None) -> None:
        path = self.work / "fixtures" / name
        path.parent.mkdir(exist_ok=True)
        extra = ["--nvml-fixture", str(fixture)] if self.dry and fixture else []
        rc, _ = self.run(
            self.sd("record-fixture", str(path), "--description", description, *extra),
            f"record-{name}.txt",
            120,
        )
        if rc != 0 or not path.is_file():
            self.row("record", name, f"record-fixture exit {rc}", False)
            return
        doc = json.loads(path.read_text(encoding="utf-8"))
        devices = doc.get("devices", [])
        up = [
            sum(1 for k, v in d["answers"].items() if k.startswith("nvlink_state/") and v == 1)
            for d in devices
        ]
        fabric = {str(d["answers"].get("fabric_info"))[:60] for d in devices}
        self.summary.setdefault("recorded", {})[name] = {
            "gpus": len(devices),
            "links_up": up,
            "fabric": sorted(fabric),
        }
        self.row(
            "record",
            name,
            f"{len(devices)} GPUs; NVLinks up per GPU {up}; fabric "
            f"{'; '.join(sorted(fabric))[:60]}",
            len(devices) == self.n and (self.dry or all(up)),
        )

    # -- 2. peers ---------------------------------------------------------------------------

    def step_peers(self) -> None:
        from multi_gpu_step_peers import peers

        peers(self)

    # -- 3 and 4. the collective ----------------------------------------------------------------

    def step_collective(self) -> None:
        from multi_gpu_step_collective import collective

        collective(self)

    # -- the end --------------------------------------------------------------------------------

    def finish(self) -> int:
        for proc in reversed(self.children):
            self.stop(proc, grace=3.0)
        self.summary["rows"] = self.rows
        self.summary["seconds"] = round(time.monotonic() - self.began, 1)
        text = table(self.summary, self.rows)
        (self.work / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))
        (self.work / "summary.txt").write_text(text, encoding="utf-8")
        self.log.close()
        out = Path(self.opts.out)
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out / "multigpu.tgz", "w:gz") as tar:
            tar.add(self.work, arcname="multigpu", filter=_no_tsdb)
        print(text, flush=True)
        return 0 if all(r["ok"] is not False for r in self.rows) else 1


def _no_tsdb(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    return None if "data" in parts[2:] and parts[1].startswith("prom") else info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry", action="store_true", help="NVML fixtures, CPU torch, gloo")
    parser.add_argument(
        "--fixture",
        default=str(FIXTURES / "nvml" / "h200-x8.json"),
        help="--dry: the machine (default the 8-GPU fixture)",
    )
    parser.add_argument("--budget", type=float, default=520.0, help="seconds for the whole run")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    parser.add_argument("--work", default=None, help="working folder (default a new /tmp one)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"subset of {','.join(STEPS)}")
    parser.add_argument("--prometheus", default=os.environ.get("PROMETHEUS", "prometheus"))
    parser.add_argument("--promtool", default=None, help="also check the shortened rules")
    parser.add_argument("--sysfs", default="/sys", help="where the PCI functions are read")
    parser.add_argument("--slow-gpu", type=int, default=1, help="step 2's co-tenant GPU")
    parser.add_argument("--straggler-rank", type=int, default=1)
    parser.add_argument("--stop-rank", type=int, default=-1, help="default: the last rank")
    parser.add_argument("--ranks", type=int, default=0, help="default: every GPU (dry: 3)")
    parser.add_argument("--plan", default="", help="job phases, e.g. traffic=15,straggler=30")
    parser.add_argument("--hang", type=float, default=50.0, help="seconds the job hangs")
    parser.add_argument("--watch", type=float, default=25.0, help="seconds watch looks each time")
    parser.add_argument("--slower-for", default="10s", help="SlowerThanPeers' for: in the copy")
    parser.add_argument("--stalled-for", default="20s", help="SparkdiagGpuStalled's for: there")
    opts = parser.parse_args(argv)
    if opts.work is None:
        import tempfile

        opts.work = tempfile.mkdtemp(prefix="multigpu.")
    parse_plan(opts.plan)  # a bad plan fails now
    unknown = sorted(set(filter(None, opts.steps.split(","))) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}: the steps are {', '.join(STEPS)}")

    def interrupted(signum: int, _frame: object) -> None:
        raise Stop(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    run = Run(opts)
    run.say(f"{run.summary['mode']}: {run.n} GPUs, budget {opts.budget:.0f} s, work {run.work}")
    try:
        if run.n < 2:
            run.row("setup", "GPUs", f"{run.n} GPU(s): this run needs 2 or more", False)
        else:
            steps = [s for s in opts.steps.split(",") if s]
            for i, step in enumerate(steps):
                run.step_end = None
                later = sum(NEED.get(s, 0.0) for s in steps[i + 1 :])
                run.step_end = time.monotonic() + run.left() - later
                if run.left() < NEED.get(step, 0.0):
                    run.row(step, "skipped", f"{run.left():.0f} s of budget left", None)
                    continue
                started = time.monotonic()
                try:
                    getattr(run, f"step_{step}")()
                except Stop:
                    raise
                except Exception as exc:
                    (run.work / f"error-{step}.txt").write_text(traceback.format_exc())
                    run.row(step, "error", f"{type(exc).__name__}: {exc}"[:200], False)
                run.summary.setdefault("step_seconds", {})[step] = round(
                    time.monotonic() - started, 1
                )
    except Stop as exc:
        run.row("run", "stopped", str(exc), False)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
