"""Training jobs built from the real frameworks (timm, torchvision, transformers, Lightning) for
scripts/device/watch_jobs.py: random data and randomly initialised models, nothing downloaded.

Each job runs with its defect, or ``clean`` without it, so that the lost share the watch reports
can be compared with the one the job's own throughput gives (1 - with / without):

  resnet-loader    ResNet-50 (timm) fed by a torchvision DataLoader, 2 workers doing
                   RandomResizedCrop, flip and ColorJitter on random images | clean: the batch
                   already on the GPU
  sleepy-loop      ResNet-50 whose loop sleeps 6 steps' time for each batch (a slow remote
                   source): under 20 % utilization | clean: no sleep
  gpt2-checkpoint  GPT-2 (124M) trained by transformers' Trainer in bf16, saving a checkpoint
                   (its own save: safetensors, optimizer, scheduler) every 15 steps | clean: no
                   checkpoints
  spin             ResNet-50 that, every 2 s, waits 1.5 s in a spinning kernel
                   (torch.cuda._sleep), as a rank waiting in a collective for a slow peer does
                   | clean: no waits
  resnet-fp32      ResNet-50 in fp32 with TF32 off (cuDNN and cuBLAS) | clean: TF32 on
  resnet           ResNet-50 in bf16, channels-last, the batch on the GPU: healthy
  lightning-gpt2   GPT-2 (124M) trained by a Lightning Trainer in bf16-mixed: healthy

Every job warms up (``WARM_SECONDS`` or a quarter of the run), then counts its items (images or
tokens) for ``seconds``, and returns the throughput. ``scale="tiny"`` makes every model and
batch small enough for a CPU.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WARM_SECONDS = 4.0
SCALES: dict[str, dict[str, Any]] = {
    "full": {"resnet": "resnet50", "image": 224, "batch": 128, "source": (375, 500),
             "gpt": {}, "gpt_batch": 8, "seq": 1024, "workers": 2},
    "tiny": {"resnet": "resnet18", "image": 32, "batch": 2, "source": (40, 48),
             "gpt": {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 512},
             "gpt_batch": 2, "seq": 64, "workers": 2},
}  # fmt: skip
FRAMEWORK_JOBS = (  # in the order they run: the slowest to import last
    "resnet-loader",
    "sleepy-loop",
    "spin",
    "gpt2-checkpoint",
    "resnet",
    "resnet-fp32",
    "lightning-gpt2",
)
SLEEP_STEPS = 6.0  # sleepy-loop: each batch costs this many steps' time asleep
SPIN_EVERY = 2.0  # spin: seconds of work between two waits
SPIN_SECONDS = 1.5
SAVE_STEPS = 15


class Meter:
    """Counts items after the warm-up: ``step(items)`` after each step, True once ``seconds``
    have been timed. The GPU is synchronised when the timing starts and ends, and after every
    step with ``each`` (a plain loop that reads its loss every step); a framework's loop is
    left as its library runs it."""

    def __init__(self, seconds: float, sync: Callable[[], None], each: bool = True) -> None:
        self.seconds = seconds
        self.sync = sync
        self.each = each
        self.warm_until = time.monotonic() + min(WARM_SECONDS, max(seconds / 4, 0.2))
        self.started: float | None = None
        self.items = 0
        self.steps = 0
        self.ended: float | None = None

    def step(self, items: int) -> bool:
        if self.each:
            self.sync()
        now = time.monotonic()
        if self.started is None:
            if now >= self.warm_until:
                self.sync()
                self.started = time.monotonic()
            return False
        self.items += items
        self.steps += 1
        if now - self.started >= self.seconds:
            self.sync()
            self.ended = time.monotonic()
            return True
        return False

    def result(self, unit: str) -> dict[str, Any]:
        elapsed = (self.ended or time.monotonic()) - (self.started or time.monotonic())
        rate = self.items / elapsed if elapsed > 0 else 0.0
        return {"steps": self.steps, "items": self.items, "seconds": elapsed,
                "per_second": rate, "unit": unit}  # fmt: skip


def _torch(device: str) -> tuple[Any, Any, Callable[[], None]]:
    import torch

    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    return torch, dev, sync


def _resnet(torch: Any, dev: Any, size: dict[str, Any], bf16: bool) -> Callable[[Any, Any], None]:
    """One training step of a timm ResNet (SGD, channels-last, bf16 autocast on CUDA)."""
    import timm

    model = timm.create_model(size["resnet"], pretrained=False, num_classes=1000)
    model = model.to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    cast = bf16 and dev.type == "cuda"

    def step(x: Any, y: Any) -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cast):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _resident(torch: Any, dev: Any, size: dict[str, Any]) -> tuple[Any, Any]:
    n, edge = size["batch"], size["image"]
    x = torch.randn(n, 3, edge, edge, device=dev).contiguous(memory_format=torch.channels_last)
    return x, torch.randint(0, 1000, (n,), device=dev)


def resnet(seconds: float, device: str, size: dict[str, Any], fp32: bool = False,
           tf32: bool = True) -> dict[str, Any]:  # fmt: skip
    torch, dev, sync = _torch(device)
    if fp32:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
    step = _resnet(torch, dev, size, bf16=not fp32)
    x, y = _resident(torch, dev, size)
    meter = Meter(seconds, sync)
    while True:
        step(x, y)
        if meter.step(size["batch"]):
            return meter.result("images")


class RandomImages:
    """A map-style dataset of random images (a pool of decoded PIL images of ImageNet's
    typical size) with the usual training augmentation, as a torchvision ImageFolder gives."""

    def __init__(self, size: dict[str, Any], length: int = 10**7) -> None:
        import numpy as np
        from PIL import Image
        from torchvision import transforms

        rng = np.random.default_rng(0)
        h, w = size["source"]
        self.pool = [
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for _ in range(16)
        ]
        self.length = length
        self.transform = transforms.Compose([
            transforms.RandomResizedCrop(size["image"]),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(0.4, 0.4, 0.4),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ])  # fmt: skip

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.transform(self.pool[i % len(self.pool)]), i % 1000


def resnet_loader(seconds: float, device: str, size: dict[str, Any], clean: bool) -> dict[str, Any]:
    torch, dev, sync = _torch(device)
    step = _resnet(torch, dev, size, bf16=True)
    meter = Meter(seconds, sync)
    if clean:
        x, y = _resident(torch, dev, size)
        while True:
            step(x, y)
            if meter.step(size["batch"]):
                return meter.result("images")
    loader = torch.utils.data.DataLoader(
        RandomImages(size), batch_size=size["batch"], num_workers=size["workers"],
        pin_memory=dev.type == "cuda", persistent_workers=True, drop_last=True,
    )  # fmt: skip
    for x, y in loader:
        x = x.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
        step(x, y.to(dev, non_blocking=True))
        if meter.step(size["batch"]):
            break
    return meter.result("images")


def sleepy_loop(seconds: float, device: str, size: dict[str, Any], clean: bool) -> dict[str, Any]:
    """The resident-batch ResNet step; for each batch the loop first sleeps ``SLEEP_STEPS``
    times the step's own time (measured after 3 warm steps), waiting for its data."""
    torch, dev, sync = _torch(device)
    step = _resnet(torch, dev, size, bf16=True)
    x, y = _resident(torch, dev, size)
    for _ in range(3):
        step(x, y)
    sync()
    began = time.monotonic()
    for _ in range(3):
        step(x, y)
    sync()
    delay = 0.0 if clean else SLEEP_STEPS * (time.monotonic() - began) / 3
    meter = Meter(seconds, sync)
    while True:
        time.sleep(delay)
        step(x, y)
        if meter.step(size["batch"]):
            return {**meter.result("images"), "sleep_seconds": delay}


def spin(seconds: float, device: str, size: dict[str, Any], clean: bool) -> dict[str, Any]:
    """The resident-batch ResNet step; every ``SPIN_EVERY`` s of it, one kernel spins for
    ``SPIN_SECONDS`` (torch.cuda._sleep, calibrated in clock cycles) and the host waits for it
    in torch.cuda.synchronize, as a rank blocked in a collective waits for a peer."""
    torch, dev, sync = _torch(device)
    step = _resnet(torch, dev, size, bf16=True)
    x, y = _resident(torch, dev, size)
    cuda = dev.type == "cuda"

    def wait(duration: float) -> None:
        if cuda:
            torch.cuda._sleep(int(cycles_per_second * duration))
            sync()
        else:  # a CPU has no kernel to spin: the host spins instead
            end = time.monotonic() + duration
            while time.monotonic() < end:
                pass

    cycles_per_second = 1e9
    if cuda:
        sync()
        began = time.monotonic()
        torch.cuda._sleep(int(1e8))
        sync()
        cycles_per_second = 1e8 / max(time.monotonic() - began, 1e-6)
    meter = Meter(seconds, sync)
    last = time.monotonic()
    spins = 0
    while True:
        step(x, y)
        if not clean and time.monotonic() - last >= SPIN_EVERY:
            wait(SPIN_SECONDS)
            spins += 1
            last = time.monotonic()
        if meter.step(size["batch"]):
            return {
                **meter.result("images"),
                "spins": spins,
                "cycles_per_second": cycles_per_second,
            }


def _gpt2(size: dict[str, Any]) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_positions=max(size["seq"], 1024), **size["gpt"])
    return GPT2LMHeadModel(config)


class RandomTokens:
    """A map-style dataset of random token sequences, labels equal to the inputs."""

    def __init__(self, vocab: int, seq: int, length: int = 10**7) -> None:
        self.vocab, self.seq, self.length = vocab, seq, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        ids = torch.randint(0, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def gpt2_checkpoint(
    seconds: float, device: str, size: dict[str, Any], clean: bool
) -> dict[str, Any]:
    """transformers' Trainer on GPT-2 (bf16 on CUDA); with the defect it saves every
    ``SAVE_STEPS`` steps with its own save (model, optimizer, scheduler, RNG state)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    _, dev, sync = _torch(device)
    cuda = dev.type == "cuda"
    model = _gpt2(size)
    tokens = size["gpt_batch"] * size["seq"]
    meter = Meter(seconds, sync, each=False)

    class Stop(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if meter.step(tokens):
                control.should_training_stop = True

    with tempfile.TemporaryDirectory(prefix="sparkdiag-trainer-") as out:
        options: dict[str, Any] = dict(
            output_dir=out, per_device_train_batch_size=size["gpt_batch"], max_steps=10**7,
            learning_rate=1e-4, lr_scheduler_type="constant", bf16=cuda,
            logging_strategy="no", report_to="none", disable_tqdm=True,
            save_strategy="no" if clean else "steps", save_steps=SAVE_STEPS, save_total_limit=1,
            dataloader_num_workers=0,
        )  # fmt: skip
        if not cuda:
            options["use_cpu"] = True
        try:
            args = TrainingArguments(**options)
        except TypeError:  # older transformers: no_cuda instead of use_cpu
            options.pop("use_cpu", None)
            args = TrainingArguments(**options, no_cuda=not cuda)
        vocab = model.config.vocab_size
        trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(vocab, size["seq"]),
                          callbacks=[Stop()])  # fmt: skip
        trainer.train()
        saves = len(list(Path(out).glob("checkpoint-*")))
    return {**meter.result("tokens"), "checkpoints_kept": saves,
            "save_steps": None if clean else SAVE_STEPS}  # fmt: skip


def lightning_gpt2_trainer(
    torch: Any, size: dict[str, Any], gpt: dict[str, Any], batch: int, cuda: bool,
    on_batch_end: Callable[[Any], None],
) -> tuple[Any, Any]:  # fmt: skip
    """A Lightning Trainer (bf16-mixed on CUDA) and a module training GPT-2 (``gpt``: its config)
    on ``batch`` x ``size["seq"]`` token batches made on the device; ``on_batch_end(trainer)``
    after each step."""
    import lightning as L

    seq = size["seq"]

    class Module(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = _gpt2({**size, "gpt": gpt})

        def training_step(self, _batch: Any, index: int) -> Any:
            vocab = self.model.config.vocab_size
            ids = torch.randint(0, vocab, (batch, seq), device=self.device)
            return self.model(input_ids=ids, labels=ids).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(range(10**7), batch_size=1)

    class AfterEach(L.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            on_batch_end(trainer)

    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu", devices=1,
        precision="bf16-mixed" if cuda else "32-true", max_steps=10**7, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[AfterEach()],
    )  # fmt: skip
    return trainer, Module()


def lightning_gpt2(seconds: float, device: str, size: dict[str, Any]) -> dict[str, Any]:
    """A Lightning Trainer on GPT-2, bf16-mixed on CUDA, token batches made on the device."""
    torch, dev, sync = _torch(device)
    meter = Meter(seconds, sync, each=False)

    def stop(trainer: Any) -> None:
        if meter.step(size["gpt_batch"] * size["seq"]):
            trainer.should_stop = True

    trainer, module = lightning_gpt2_trainer(
        torch, size, size["gpt"], size["gpt_batch"], dev.type == "cuda", stop
    )
    trainer.fit(module)
    return meter.result("tokens")


OFFLINE = {  # nothing is downloaded: fail at once rather than wait on a network there is not
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_DISABLED": "true",
    "WANDB_MODE": "disabled",
}


def run(name: str, seconds: float, device: str, scale: str, clean: bool) -> dict[str, Any]:
    """Run one job (its defect unless ``clean``) and return its throughput document."""
    os.environ.update(OFFLINE)
    size = SCALES[scale]
    if name == "resnet-loader":
        doc = resnet_loader(seconds, device, size, clean)
    elif name == "sleepy-loop":
        doc = sleepy_loop(seconds, device, size, clean)
    elif name == "gpt2-checkpoint":
        doc = gpt2_checkpoint(seconds, device, size, clean)
    elif name == "spin":
        doc = spin(seconds, device, size, clean)
    elif name == "resnet-fp32":
        doc = resnet(seconds, device, size, fp32=True, tf32=clean)
    elif name == "resnet":
        doc = resnet(seconds, device, size)
    elif name == "lightning-gpt2":
        doc = lightning_gpt2(seconds, device, size)
    else:
        raise SystemExit(f"unknown framework job {name}")
    if not math.isfinite(doc["per_second"]) or doc["steps"] == 0:
        raise SystemExit(f"{name}: no step was timed")
    return doc
