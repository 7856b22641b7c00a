"""Jobs whose time goes in the training loop's own code, or to a neighbour on the GPU, for
scripts/device/watch_jobs.py (issue 28): random data, models built from configs, nothing
downloaded. Each runs with its defect, or ``clean`` without it, so that the truth is
1 - throughput with / without; the line the defect is on carries a ``# watch: NAME`` comment,
which :func:`marked` finds, so that the line watch names can be checked against it.

  cotenant            ResNet-50 (timm), bf16, batch on the GPU; the defect is not in the job:
                      watch_jobs.py starts :func:`neighbour` (bf16 8192^3 matmuls in another
                      process) beside it | clean: alone
  gpt2-host-sync      GPT-2 124M (transformers) copying its logits to the host and scoring them
                      with numpy every step | clean: scored on the GPU, nothing copied
  gpt2-tokenize       GPT-2 fed by text tokenized in the training thread every step (a
                      GPT2Tokenizer, Python BPE, over a vocabulary trained on random words with
                      tokenizers) | clean: tokenized once before the loop
  resnet18-pageable   ResNet-18 (timm) fed by .cuda() of a pageable batch every step | clean:
                      pinned memory, non_blocking=True
  launch-bound        512x512 bf16 matmuls launched one by one from Python | clean: the same
                      matmuls as one batched torch.bmm
  lightning-checkpoint  a ~200M-parameter GPT-2 with AdamW under a Lightning Trainer, saved
                      (trainer.save_checkpoint) after its first step and every SAVE_EVERY
                      steps after it | clean: never saved
  compile-recompile   an MLP under torch.compile whose input length changes every
                      RECOMPILE_EVERY steps, static shapes (a recompilation each time) | clean:
                      dynamic=True, compiled once
  vit                 ViT-B/16 (timm), bf16, batch on the GPU: healthy

``scale="tiny"`` makes every model and batch small enough for a CPU (torch.compile then uses
the aot_eager backend, which needs no compiler).
"""

from __future__ import annotations

import re
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import framework_jobs as fw

SAVE_EVERY = {"full": 25, "tiny": 3}
RECOMPILE_EVERY = 4
LAUNCHES = 100  # matmuls per step of the launch-bound loop
SCALES: dict[str, dict[str, Any]] = {
    "full": {"pageable_batch": 256, "big_gpt": {"n_layer": 12, "n_embd": 1024, "n_head": 16},
             "big_batch": 4, "mlp": (32, 1024, 4), "vit": "vit_base_patch16_224", "vit_batch": 64,
             "words": 6000},
    "tiny": {"pageable_batch": 2, "big_gpt": {"n_layer": 2, "n_head": 2, "n_embd": 64,
                                              "vocab_size": 512},
             "big_batch": 2, "mlp": (2, 32, 2), "vit": "vit_tiny_patch16_224", "vit_batch": 2,
             "words": 40},
}  # fmt: skip


def marked(name: str) -> int:
    """The line of this file that carries ``# watch: NAME`` (the defect watch must name)."""
    for number, line in enumerate(Path(__file__).read_text().splitlines(), 1):
        if re.search(rf"#\s*watch:\s*{re.escape(name)}\s*$", line):
            return number
    raise LookupError(name)


def _size(scale: str) -> dict[str, Any]:
    return {**fw.SCALES[scale], **SCALES[scale]}


# -- the neighbour of the co-tenant job ----------------------------------------------------------


def neighbour(device: str, scale: str, go: str | None = None) -> None:
    """bf16 matmuls back to back until killed: another user's job on the same GPU. With
    ``go``, torch imported first and the GPU left alone until that file exists (started beside
    the job's run alone, it adds only its CUDA start-up to the watched run's wait)."""
    import torch

    while go is not None and not Path(go).exists():
        time.sleep(0.05)
    n = 8192 if scale == "full" else 256
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    while True:
        for _ in range(10):
            a @ a
        if dev.type == "cuda":
            torch.cuda.synchronize()


# -- the jobs -------------------------------------------------------------------------------------


def gpt2_host_sync(
    seconds: float, device: str, size: dict[str, Any], clean: bool, to: bool = False
) -> Any:
    """GPT-2 steps that read every step's logits on the host; with ``to``, through
    ``.to(torch.device("cpu"))`` rather than ``.cpu()`` (watch once took that call for a copy
    to the GPU: a review's finding of 2026-12-05, fixed on fixtures alone)."""
    torch, dev, sync = fw._torch(device)
    model = fw._gpt2(size).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cuda = dev.type == "cuda"
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (size["gpt_batch"], size["seq"]), device=dev)
    labels = ids.cpu().numpy()
    cpu = torch.device("cpu")
    meter = fw.Meter(seconds, sync)
    scores = []
    while True:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if clean:  # the accuracy on the GPU: nothing comes back but at the meter's sync
            scores.append((out.logits.argmax(-1) == ids).float().mean())
        elif to:
            logits = out.logits.detach().float().to(cpu).numpy()  # watch: host-sync-to
            scores.append(float((logits.argmax(-1) == labels).mean()))
        else:
            logits = out.logits.detach().float().cpu().numpy()  # watch: host-sync
            scores.append(float((logits.argmax(-1) == labels).mean()))
        if meter.step(ids.numel()):
            return meter.result("tokens")


def _tokenizer(size: dict[str, Any], workdir: Path) -> Any:
    """A GPT2Tokenizer (Python BPE) over a byte-level BPE vocabulary trained here on random
    words (tokenizers), and the texts it will tokenize: nothing downloaded."""
    import random

    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Tokenizer

    rng = random.Random(0)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 11)))
             for _ in range(size["words"] * 4)]  # fmt: skip
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([" ".join(rng.choices(words, k=200)) for _ in range(400)],
                                vocab_size=8000 if size["words"] > 100 else 300,
                                show_progress=False)  # fmt: skip
    trainer.save_model(str(workdir))
    tokenizer = GPT2Tokenizer(str(workdir / "vocab.json"), str(workdir / "merges.txt"))
    texts = [
        [" ".join(rng.choices(words, k=size["seq"])) for _ in range(size["gpt_batch"])]
        for _ in range(64)
    ]
    return tokenizer, texts


def gpt2_tokenize(seconds: float, device: str, size: dict[str, Any], clean: bool) -> Any:
    torch, dev, sync = fw._torch(device)
    model = fw._gpt2(size).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cuda = dev.type == "cuda"
    seq, vocab = size["seq"], model.config.vocab_size
    with tempfile.TemporaryDirectory(prefix="sparkdiag-tokenizer-") as workdir:
        tokenizer, texts = _tokenizer(size, Path(workdir))

    def encode(batch: list[str]) -> Any:
        rows = [tokenizer(text)["input_ids"][:seq] for text in batch]  # watch: data-prep-in-loop
        rows = [[t % vocab for t in r] + [0] * (seq - len(r)) for r in rows]
        return torch.tensor(rows, device=dev)

    ready = encode(texts[0])
    meter = fw.Meter(seconds, sync)
    step = 0
    while True:
        ids = ready if clean else encode(texts[step % len(texts)])
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if meter.step(ids.numel()):
            return meter.result("tokens")


def resnet18_pageable(seconds: float, device: str, size: dict[str, Any], clean: bool) -> Any:
    torch, dev, sync = fw._torch(device)
    step = fw._resnet(torch, dev, {**size, "resnet": "resnet18"}, bf16=True)
    n, edge = size["pageable_batch"], size["image"]
    host = torch.randn(n, 3, edge, edge)
    labels = torch.randint(0, 1000, (n,), device=dev)
    if clean and dev.type == "cuda":
        host = host.pin_memory()
    meter = fw.Meter(seconds, sync)
    while True:
        if clean:
            x = host.to(dev, non_blocking=True)
        else:
            x = host.cuda() if dev.type == "cuda" else host.clone()  # watch: pageable-copies
        step(x.contiguous(memory_format=torch.channels_last), labels)
        if meter.step(n):
            return meter.result("images")


def launch_bound(seconds: float, device: str, size: dict[str, Any], clean: bool) -> Any:
    torch, dev, sync = fw._torch(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    edge = 512 if size["image"] >= 224 else 64
    xs = torch.randn(LAUNCHES, edge, edge, device=dev, dtype=dtype)
    w = torch.randn(edge, edge, device=dev, dtype=dtype)
    ws = w.expand(LAUNCHES, edge, edge)
    meter = fw.Meter(seconds, sync)
    while True:
        if clean:
            torch.bmm(xs, ws)
        else:
            for i in range(LAUNCHES):
                xs[i] @ w  # watch: launch-bound
        if meter.step(LAUNCHES):
            return meter.result("matmuls")


def lightning_checkpoint(
    seconds: float, device: str, size: dict[str, Any], clean: bool, scale: str
) -> Any:
    torch, dev, sync = fw._torch(device)
    batch, seq = size["big_batch"], size["seq"]
    meter = fw.Meter(seconds, sync, each=False)
    path = Path(tempfile.gettempdir()) / f"sparkdiag-watch-lightning-{time.monotonic_ns()}.ckpt"
    every = SAVE_EVERY[scale]
    saves = []

    def after_each(trainer: Any) -> None:
        # from the first step on: a run of a few steps (a test's, on a loaded CPU) saves too
        if not clean and (trainer.global_step - 1) % every == 0:
            trainer.save_checkpoint(path)  # watch: checkpoint-stalls
            saves.append(trainer.global_step)
        if meter.step(batch * seq):
            trainer.should_stop = True

    trainer, module = fw.lightning_gpt2_trainer(
        torch, size, size["big_gpt"], batch, dev.type == "cuda", after_each
    )
    try:
        trainer.fit(module)
    finally:
        path.unlink(missing_ok=True)
    return {**meter.result("tokens"), "saves": len(saves), "save_every": None if clean else every}


def compile_recompile(seconds: float, device: str, size: dict[str, Any], clean: bool) -> Any:
    torch, dev, sync = fw._torch(device)
    cuda = dev.type == "cuda"
    batch, width, layers = size["mlp"]
    dtype = torch.bfloat16 if cuda else torch.float32
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                   torch.nn.Linear(4 * width, width)]  # fmt: skip
    net = torch.nn.Sequential(*blocks).to(dev, dtype)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    config = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):  # renamed in torch 2.6
        if hasattr(config, name):
            setattr(config, name, 64)
    config.automatic_dynamic_shapes = clean
    torch._dynamo.reset()  # a run before in the same process (--pair) compiled the same code
    model = torch.compile(net, dynamic=clean, backend="inductor" if cuda else "aot_eager")
    meter = fw.Meter(seconds, sync)
    step = 0
    while True:
        length = 64 + 8 * ((step // RECOMPILE_EVERY) % 48)  # a new length every few steps
        x = torch.randn(batch, length, width, device=dev, dtype=dtype)
        loss = model(x).float().pow(2).mean()  # watch: recompiling
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if meter.step(batch * length):
            return {**meter.result("tokens"), "lengths": min(step // RECOMPILE_EVERY + 1, 48)}


def vit(seconds: float, device: str, size: dict[str, Any]) -> Any:
    import timm

    torch, dev, sync = fw._torch(device)
    model = timm.create_model(size["vit"], pretrained=False).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n = size["vit_batch"]
    x = torch.randn(n, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (n,), device=dev)
    cuda = dev.type == "cuda"
    meter = fw.Meter(seconds, sync)
    while True:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if meter.step(n):
            return meter.result("images")


# name -> (what watch must say, the marked defect line's name or None)
EXPECTED = {
    "cotenant": ("co-tenant", None),
    "gpt2-host-sync": ("host-sync", "host-sync"),
    "gpt2-host-sync-to": ("host-sync", "host-sync-to"),
    "gpt2-tokenize": ("data-prep-in-loop", "data-prep-in-loop"),
    "resnet18-pageable": ("pageable-copies", "pageable-copies"),
    "launch-bound": ("cpu-bound-launcher", "launch-bound"),
    "lightning-checkpoint": ("checkpoint-stalls", "checkpoint-stalls"),
    "compile-recompile": ("recompiling", "recompiling"),
    "vit": ("healthy", None),
}
LOOP_JOBS = tuple(EXPECTED)


def run(name: str, seconds: float, device: str, scale: str, clean: bool) -> dict[str, Any]:
    """Run one job (its defect unless ``clean``) and return its throughput document."""
    import os

    os.environ.update(fw.OFFLINE)
    size = _size(scale)
    jobs: dict[str, Any] = {
        "cotenant": lambda: fw.resnet(seconds, device, size),  # the defect is its neighbour
        "gpt2-host-sync": lambda: gpt2_host_sync(seconds, device, size, clean),
        "gpt2-host-sync-to": lambda: gpt2_host_sync(seconds, device, size, clean, to=True),
        "gpt2-tokenize": lambda: gpt2_tokenize(seconds, device, size, clean),
        "resnet18-pageable": lambda: resnet18_pageable(seconds, device, size, clean),
        "launch-bound": lambda: launch_bound(seconds, device, size, clean),
        "lightning-checkpoint": lambda: lightning_checkpoint(seconds, device, size, clean, scale),
        "compile-recompile": lambda: compile_recompile(seconds, device, size, clean),
        "vit": lambda: vit(seconds, device, size),
    }
    if name not in jobs:
        raise SystemExit(f"unknown loop job {name}")
    doc: dict[str, Any] = jobs[name]()
    return doc


if __name__ == "__main__" and sys.argv[1:2] == ["neighbour"]:
    neighbour(sys.argv[2], sys.argv[3], *sys.argv[4:5])
