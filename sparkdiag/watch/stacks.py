"""What the job's threads were doing, read from the stacks in a recording: each stack gets an
activity and the line of the job's own code that took the time (a pure function of the
recording, like the rest of the diagnosis).

An activity is read from the outermost frame that names one (where one frame could name two,
in this order): importing modules (the job still starting: the diagnosis leaves such ticks at
the window's start out), compiling
(``torch._dynamo``'s frame conversion, inductor's compiler), a checkpoint (``torch.save``,
safetensors, distributed checkpoint, a framework's ``save_checkpoint``), a collective
(``torch.distributed``'s ``all_reduce``, ``barrier``...), the DataLoader (waiting for its worker
processes, or loading in the training thread when it has none), logging (``logging``, wandb,
TensorBoard, a framework's loggers), the optimizer step (``torch.optim``, DeepSpeed's CPU Adam),
a host sync in a library frame (``torch.cuda.synchronize``, a tensor formatted for printing,
``Tensor.__array__``) or in a native one (``cudaStreamSynchronize``, ``_local_scalar_dense``: with
``--stacks native``), waiting (``threading``, ``queue``, ``selectors``...). Else the leaf decides:
a data library (tokenizers, PIL, torchvision's transforms, ...) is data preparation; a model or
framework library (``torch``, transformers' models, timm, Lightning...) launches kernels; a line
of the job's own code is read from its text, which the recording keeps: ``.item()``, ``.cpu()``,
``.tolist()``, ``.numpy()``, ``synchronize()`` and a ``.to(...)`` whose arguments name the
``cpu`` are a host sync, ``.cuda(`` and ``.to(...device...)`` a copy to the GPU,
``torch.``/``model(``/``.backward(``/``@`` launching, ``sleep(`` waiting,
``print(`` logging. Anything else the job's own code does (pure Python, numpy) is ``USER``: the
diagnosis decides per tick whether that was launching or preparing data, and a ``USER`` stack
inside a function that syncs, below the line that syncs, is the host working on the results it
copied (``AFTER_SYNC``; :mod:`.threads` reads a whole recording: which thread trains, what it
did tick by tick).

**The job's own code** is every file that is no library's: not under ``site-packages`` or the
interpreter's own ``lib/pythonX.Y``, and without a library's package folder (``/torch/``,
``/diffusers/``...: a library installed with ``pip --target`` or on ``PYTHONPATH``) in its path.
A package folder above the job's working directory or the folder of the script it runs as
``__main__`` (:func:`own_roots`) does not count, nor one whose next folder is ``examples/`` or
``scripts/``: ``/home/u/diffusers/examples/text_to_image/train_text_to_image.py`` is the job's
(its ``.item()`` a sync, not a library launching), ``/repo/transformers/src/transformers/`` under
a job run from ``/repo/transformers`` still the library's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparkdiag.watch.model import StackFrame

IMPORTING = "importing"
COMPILE = "compile"
CHECKPOINT = "checkpoint"
COLLECTIVE = "collective"
DATALOADER = "dataloader"
LOGGING = "logging"
OPTIMIZER = "optimizer"
HOST_OPTIMIZER = "host-optimizer"  # an optimizer that steps on the CPU (DeepSpeed's CPU Adam)
SYNC = "sync"
AFTER_SYNC = "after-sync"
COPY = "copy"
WAITING = "waiting"
DATA_PREP = "data-prep"
LAUNCH = "launch"
USER = "user"
NOTHING = "nothing"  # no Python frame at all: the interpreter starting or ending

# torch.compile's compilers: the modules that run only while it compiles (dynamo's tracing,
# AOTAutograd, which compiles a backward lazily at its first call, inductor's lowering and code
# generation, fake tensors and symbolic shapes, triton's compiler) and not the ones that also
# run the compiled code (_COMPILED_RUNTIME), where only autotuning a kernel at its first call
# is compiling. Any frame of them decides, not only the outermost: py-spy reads a compiler's
# deep stacks partly at times (it sees the innermost frames of a stack hundreds deep)
_COMPILING = (
    "torch/_dynamo/", "torch/_inductor/", "torch/_functorch/_aot_autograd/",
    "torch/_functorch/aot_autograd.py", "torch/_functorch/partitioners.py",
    "torch/_functorch/compile_utils.py", "torch/fx/experimental/", "torch/_subclasses/fake_",
    "torch/_library/fake_impl.py", "triton/compiler/",
)  # fmt: skip
_COMPILED_RUNTIME = (
    "torch/_dynamo/eval_frame.py", "torch/_dynamo/external_utils.py",
    "torch/_inductor/runtime/", "torch/_inductor/generated/", "torch/_inductor/output_code.py",
    "torch/_inductor/utils.py", "torch/_functorch/_aot_autograd/runtime_wrappers.py",
    "torch/_functorch/_aot_autograd/utils.py",
)  # fmt: skip
_TUNING = re.compile(r"precompile|autotune|benchmark_all_configs|coordinate_descent")
_SAVING_FILES = ("torch/serialization.py", "safetensors/", "torch/distributed/checkpoint/")
_SAVING = re.compile(r"save_?checkpoint|save_pretrained|save_model|save_state\b|_save\b|save_file")
_SAVING_TEXT = re.compile(
    r"\btorch\.save\(|\bsave_file\(|\.save_pretrained\(|\bfsync\(|pickle\.dump|save_checkpoint\("
)
_COLLECTIVES = {
    "all_reduce", "barrier", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "gather",
    "scatter", "monitored_barrier", "send", "recv", "wait", "all_to_all", "all_to_all_single",
}  # fmt: skip
_COLLECTIVE_TEXT = re.compile(r"\bdist\.(all_reduce|barrier|all_gather|broadcast)\(|\.wait\(\)")
_LOGGERS = (
    "logging/", "wandb/", "torch/utils/tensorboard/", "tensorboardX/", "tensorboard/", "mlflow/",
    "lightning/pytorch/loggers/", "lightning/fabric/loggers/", "pytorch_lightning/loggers/",
    "aim/", "comet_ml/", "neptune/", "clearml/", "tqdm/",
)  # fmt: skip
_OPTIMIZERS = ("torch/optim/", "deepspeed/ops/", "apex/optimizers/", "bitsandbytes/optim/")
_HOST_OPTIMIZERS = ("deepspeed/ops/adam/cpu_adam", "deepspeed/ops/adagrad/cpu_adagrad",
                    "deepspeed/ops/lion/cpu_lion")  # fmt: skip
_SYNC_FRAMES = {
    "torch/cuda/__init__.py": ("synchronize",),
    "torch/cuda/streams.py": ("synchronize",),
    "torch/_tensor.py": ("__array__", "__repr__", "__format__", "__str__", "numpy", "tolist"),
    "torch/_tensor_str.py": ("",),
}
_NATIVE_SYNC = re.compile(
    r"cudaStreamSynchronize|cuStreamSynchronize|cudaDeviceSynchronize|cuCtxSynchronize|"
    r"cudaEventSynchronize|cuEventSynchronize|_local_scalar_dense|THPVariable_item|"
    r"THPVariable_tolist|THPVariable_numpy|cuMemcpyDtoH|cudaMemcpy\b"
)
_NATIVE_LAUNCH = re.compile(r"cudaLaunchKernel|cuLaunchKernel|cudaGraphLaunch")
_WAITS = (
    "threading.py", "queue.py", "selectors.py", "multiprocessing/connection.py",
    "multiprocessing/queues.py", "multiprocessing/synchronize.py", "asyncio/",
    "concurrent/futures/", "subprocess.py", "socket.py",
)  # fmt: skip
_DATA_LIBRARIES = (
    "tokenizers/", "sentencepiece/", "tiktoken/", "PIL/", "torchvision/transforms/",
    "torchvision/io/", "torchvision/datasets/", "cv2/", "albumentations/", "datasets/",
    "pandas/", "pyarrow/", "h5py/", "imageio/", "decord/", "torchaudio/", "librosa/",
    "soundfile", "webdataset/", "json/", "csv.py", "torch/utils/data/",
)  # fmt: skip
_TOKENIZERS = re.compile(r"(^|/)tokenization_|/tokenizer")
_MODELS = (
    "torch/", "transformers/", "timm/", "lightning/", "pytorch_lightning/", "accelerate/",
    "torchvision/", "triton/", "apex/", "deepspeed/", "xformers/", "flash_attn/", "peft/",
    "diffusers/", "torchmetrics/", "einops/", "lightning_fabric/",
)  # fmt: skip
SYNC_TEXT = re.compile(
    r"\.item\(\)|\.cpu\(\)|\.tolist\(\)|\.numpy\(|synchronize\(|"
    r"\.to\(\s*(device\s*=\s*)?['\"]cpu['\"]"
)
# a copy to the host: "cpu" anywhere in .to()'s arguments (.to(torch.device("cpu")),
# .to(cpu_device), .to(device=host_cpu)), a call inside them included: read before COPY_TEXT,
# whose "device" it holds too
TO_HOST_TEXT = re.compile(r"\.to\((?:[^()]|\([^()]*\))*?(?:\([^()]*)?cpu", re.IGNORECASE)
COPY_TEXT = re.compile(r"\.cuda\(|\.pin_memory\(|\.to\([^)]*(cuda|device|dev\b|gpu|non_blocking)")
_LAUNCH_TEXT = re.compile(
    r"\btorch\.|\bF\.|\bnn\.|\bmodel\(|\.backward\(|\.step\(|\.zero_grad\(|\bforward\(|\s@\s"
)
_SLEEP_TEXT = re.compile(r"\bsleep\(")
_PRINT_TEXT = re.compile(r"\bprint\(|\blog(ger|ging)?\.(info|debug|warning)\(")
# the libraries whose frames the rules read, found by their package folder wherever they are
# installed (a --target folder or PYTHONPATH entry has no site-packages in its path); a clone's
# examples/ and scripts/ are the job's own code (diffusers/examples/text_to_image/train_...py)
_PACKAGE_ROOT = re.compile(
    r"/(torch|transformers|timm|lightning|pytorch_lightning|lightning_fabric|tokenizers|numpy|"
    r"PIL|torchvision|torchaudio|accelerate|datasets|safetensors|deepspeed|triton|apex|peft|"
    r"diffusers|wandb|tensorboard|tensorboardX|mlflow|sentencepiece|tiktoken|cv2|"
    r"albumentations|pandas|pyarrow|torchmetrics|xformers|flash_attn|bitsandbytes|einops)/"
    r"(?!(?:examples|scripts)/)(?!.*/(site|dist)-packages/)"
)


def _installed(file: str) -> str | None:
    """The path of a frame from the interpreter's own ``lib/pythonX.Y`` or a ``site-packages``
    folder, below it; a frame with no file of its own (``<frozen runpy>``, native) as it is."""
    if file.startswith("<eval_with_key>"):  # code torch.fx generated (a compiled graph)
        return "torch/fx/generated/" + file
    if not file or file.startswith("<"):
        return file or "<native>"
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in file:
            return file.rsplit(marker, 1)[1]
    match = re.search(r"/lib/python3[.\d]*/(.*)$", file)
    return match.group(1) if match else None


def _below(file: str, own: Sequence[str]) -> str:
    """``file`` from the deepest of the job's own folders it lies under (``/sub/x.py``), or
    whole where it lies under none."""
    for root in sorted(own, key=len, reverse=True):
        top = root.rstrip("/")
        if top and file.startswith(top + "/"):
            return file[len(top) :]
    return file


def library_path(file: str, own: Sequence[str] = ()) -> str | None:
    """The path of a library frame from its package root (``torch/serialization.py``,
    ``threading.py``); None for the job's own code. ``own``: the job's own folders
    (:func:`own_roots`): a library's package folder above them is no library's (the module
    docstring)."""
    return _library_path(file, tuple(own))


# A job's stacks name a few hundred files, read again for every sample of every stack (some
# 4 million times in a replay of the six H200 watch recordings): the answer is a function of
# its arguments alone, so each is worked out once.
@functools.lru_cache(maxsize=8192)
def _library_path(file: str, own: tuple[str, ...]) -> str | None:
    installed = _installed(file)
    if installed is not None:
        return installed
    below = _below(file, own)
    match = _PACKAGE_ROOT.search(below)  # installed elsewhere: pip --target, PYTHONPATH
    if match:
        return below[match.start() + 1 :]
    if "/torchinductor_" in file:
        return "torch/_inductor/generated/" + file.rsplit("/", 1)[-1]
    if file.endswith((".so", ".so.1", ".so.2")) or ".so." in file:
        return "<native>/" + file.rsplit("/", 1)[-1]
    return None


def function_name(name: str) -> str:
    """A frame's function as a report names it: a comprehension's by the function it is in
    (``tokenize.<locals>.<listcomp>`` is ``tokenize``: the same line)."""
    return re.sub(r"\.?<locals>\.<(listcomp|genexpr|dictcomp|setcomp)>$|^<(listcomp|genexpr|"
                  r"dictcomp|setcomp)>$", "", name) or name  # fmt: skip


def own_roots(
    cwd: str, frames: Sequence[StackFrame], stacks: Iterable[Sequence[int]]
) -> tuple[str, ...]:
    """The folders of the job's own code: its working directory (as the job sees it, "" where
    not known) and the folder of each script it runs as ``__main__``: a stack's outermost frame
    where it is a module's top level (``<module>``: ``python train.py``), else its first frame
    below the interpreter's own (runpy's, for ``python -m``) where that is a top level and no
    library's by its path (``python -m torch.distributed.run`` from a ``PYTHONPATH`` folder is
    not the job's)."""
    roots = [cwd] if cwd.startswith("/") else []
    for ids in stacks:
        for n, i in enumerate(ids):
            f = frames[i]
            if _installed(f.file) is not None:
                continue
            if f.function == "<module>" and (n == 0 or library_path(f.file, roots[:1]) is None):
                folder = f.file.rsplit("/", 1)[0]
                if folder and folder not in roots:
                    roots.append(folder)
            break
    return tuple(roots)


def short_file(file: str, cwd: str = "", own: Sequence[str] = ()) -> str:
    """A frame's file as a report names it: a library's from its package root, the job's own
    relative to its working directory where it lies under it. ``own``: the job's own folders
    (:func:`own_roots`; its working directory where not given)."""
    lib = library_path(file, own or ((cwd,) if cwd else ()))
    if lib is not None:
        return lib
    if cwd and file.startswith(cwd.rstrip("/") + "/"):
        return file[len(cwd.rstrip("/")) + 1 :]
    return file


@dataclass(frozen=True)
class Reading:
    """A stack's activity; ``site``: the frame (index into the recording's frames) of the job's
    own code that took the time (its innermost), else the frame that decided; ``via``: the
    library frame that decided, where there is one."""

    activity: str
    site: int | None
    via: int | None = None


def _function(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def read(
    frames: Sequence[StackFrame],
    ids: Sequence[int],
    own: Sequence[str] = (),
    libraries: Sequence[str | None] | None = None,
) -> Reading:
    """The activity of one stack (``frames`` outermost first, ``ids`` their indexes); ``own``:
    the job's own folders (:func:`library_path`); ``libraries``: the frames' library paths
    where the caller has them (:func:`library_path` of each frame with ``own``)."""
    libs = list(libraries) if libraries is not None else [library_path(f.file, own) for f in frames]
    user = [i for i, lib in enumerate(libs) if lib is None]
    site = ids[user[-1]] if user else (ids[-1] if ids else None)

    def found(activity: str, at: int) -> Reading:
        return Reading(activity, site if user else ids[at], ids[at])

    marked = _by_frames(frames, libs)
    if marked is not None:
        activity, at = marked
        if activity == DATALOADER and any((lib or "").startswith("torch/utils/data/_utils/fetch")
                                          for lib in libs):  # fmt: skip
            # no worker processes: the training thread loads the batch itself
            deeper = [i for i in user if i > at]
            return Reading(DATA_PREP, ids[deeper[-1]] if deeper else site, ids[at])
        return found(activity, at)
    if not frames:
        return Reading(NOTHING, None)
    leaf = len(frames) - 1
    lib = libs[leaf]
    if lib is not None:
        if lib.startswith(_WAITS):
            return found(WAITING, leaf)
        if lib.startswith(_DATA_LIBRARIES) or _TOKENIZERS.search(lib):
            return found(DATA_PREP, leaf)
        if lib.startswith("<native>") and _NATIVE_LAUNCH.search(frames[leaf].function):
            return found(LAUNCH, leaf)
        if lib.startswith(_MODELS):
            return found(LAUNCH, leaf)
        return Reading(USER, site, ids[leaf])
    text = frames[leaf].text
    for pattern, activity in (
        (SYNC_TEXT, SYNC),
        (TO_HOST_TEXT, SYNC),
        (_SAVING_TEXT, CHECKPOINT),
        (_COLLECTIVE_TEXT, COLLECTIVE),
        (COPY_TEXT, COPY),
        (_SLEEP_TEXT, WAITING),
        (_PRINT_TEXT, LOGGING),
        (_LAUNCH_TEXT, LAUNCH),
    ):
        if pattern.search(text):
            return Reading(activity, site)
    return Reading(USER, site)


def _by_frames(frames: Sequence[StackFrame], libs: list[str | None]) -> tuple[str, int] | None:
    """The activity a library (or native) frame gives, and that frame's position: the
    outermost frame that gives one (a compilation that imports modules is compiling, an import
    that runs a compiler module's code is importing)."""
    for i, (f, lib) in enumerate(zip(frames, libs, strict=True)):
        for activity, rule in _RULES:
            if rule(f, lib) and (activity != OPTIMIZER or _only_optimizer(libs[i + 1 :])):
                if activity == OPTIMIZER and any(
                    (x or "").startswith(_HOST_OPTIMIZERS) for x in libs[i:]
                ):
                    return HOST_OPTIMIZER, i
                return activity, i
    return None


def _only_optimizer(deeper: list[str | None]) -> bool:
    """Nothing but the optimizer's own work below its frame: a closure it calls (Lightning runs
    the whole training step inside ``optimizer.step(closure)``) is that step, not the
    optimizer's."""
    inside = ("torch/", *_OPTIMIZERS)
    closure = ("torch/autograd/", "torch/nn/")
    return all(lib is not None and lib.startswith(inside) and not lib.startswith(closure)
               for lib in deeper)  # fmt: skip


def _importing(f: StackFrame, lib: str | None) -> bool:
    return (lib or "").startswith(("<frozen importlib", "importlib/"))


def _compiling(f: StackFrame, lib: str | None) -> bool:
    if lib is None or not lib.startswith((*_COMPILING, "torch/_inductor/runtime/")):
        return False
    if lib.startswith(_COMPILED_RUNTIME):
        return lib.startswith("torch/_inductor/runtime/") and bool(_TUNING.search(f.function))
    return True


def _saving(f: StackFrame, lib: str | None) -> bool:
    if lib is not None and lib.startswith(_SAVING_FILES):
        return True
    return bool(_SAVING.search(_function(f.function))) or (
        lib is None and bool(_SAVING_TEXT.search(f.text))
    )


def _collective(f: StackFrame, lib: str | None) -> bool:
    """A collective of ``torch.distributed`` (not the rendezvous of torchrun's own agent, in
    ``torch/distributed/elastic/``, which is no rank's training)."""
    return (
        lib is not None
        and lib.startswith("torch/distributed/")
        and not lib.startswith("torch/distributed/elastic/")
        and _function(f.function) in _COLLECTIVES
    )


def _loader(f: StackFrame, lib: str | None) -> bool:
    return lib == "torch/utils/data/dataloader.py" and _function(f.function) == "__next__"


def _logging(f: StackFrame, lib: str | None) -> bool:
    return lib is not None and lib.startswith(_LOGGERS)


def _optimizer(f: StackFrame, lib: str | None) -> bool:
    """The step itself (an optimizer's ``step`` or the per-tensor loops it runs), not building
    one or its learning-rate schedule."""
    name = _function(f.function)
    return (
        lib is not None
        and lib.startswith(_OPTIMIZERS)
        and not lib.startswith("torch/optim/lr_scheduler")
        and (name == "step" or name.startswith(("_single_tensor", "_multi_tensor", "_fused")))
    )


def _sync(f: StackFrame, lib: str | None) -> bool:
    if lib is None:
        return False
    if lib.startswith("<native>"):
        return bool(_NATIVE_SYNC.search(f.function))
    names = _SYNC_FRAMES.get(lib)
    return names is not None and ("" in names or _function(f.function) in names)


_RULES = (
    (IMPORTING, _importing),
    (COMPILE, _compiling),
    (CHECKPOINT, _saving),
    (COLLECTIVE, _collective),
    (DATALOADER, _loader),
    (LOGGING, _logging),
    (OPTIMIZER, _optimizer),
    (SYNC, _sync),
)
