"""What to install instead when a package has no native code for a GPU: one line per package
the public reports name, and a general line for the rest. Each line says where its figure or
fact comes from."""

from __future__ import annotations

from sparkdiag.native.compat import arch_list_entry, sm_name

GENERAL = (
    "reinstall {package} built for {sm}; built from source, give the architecture list "
    '(TORCH_CUDA_ARCH_LIST="{arch}" for torch extensions, -gencode arch=compute_{num},'
    "code=sm_{num} for nvcc): a kernel build that is not given one falls back to an old "
    "target (sm_52 in huggingface/kernels-community#866)"
)
# torch pins its nvidia-* wheels (2.14.1's cu130 wheel: cuDNN, NCCL, cuSPARSELt and NVSHMEM
# by version, the others through cuda-toolkit[cublas,cufft,cufile,...]==13.0.3), so a
# pip install -U of one of them alone leaves the version torch asks for.
NVIDIA_WHEEL = (
    "where torch brought {package} (pip show torch: its requirements pin it), install the "
    "torch built for a newer CUDA, whose nvidia-* wheels carry newer architectures (sm_120 "
    "from CUDA 12.8; nvcc 13.0 builds sm_121 and sm_121a); a pip install -U {package} alone "
    "breaks that pin. Where nothing pins it: pip install -U {package}, or its wheel of a "
    "newer CUDA (nvidia-*-cu13 for -cu12)"
)
# cuFile's GPU code is five kernels of GPUDirect Storage (cuFileCopyGpu,
# cuFileCopyGpuPosixIORetry, cuFileInlineGpu, cuFileSparseGpu, cuFileGpuWaitValue32: the
# symbol table of its sm_86 cubin), that copy and wait. nvidia-cufile 1.15.1.6, which torch's
# cu130 wheels pin (cuda-toolkit 13.0.3), carries SASS sm_75, sm_80, sm_86 and PTX compute_86
# of ISA 7.1; 1.16.0.49 (CUDA 13.1's), 1.17.0.44, 1.18.0.66 and 1.20.0.107 carry SASS sm_75
# to sm_90 and PTX compute_90, none for 10.x or 12.x (read from the PyPI wheels, 2026-12-03).
CUFILE_HOPPER = (
    "install a torch built for CUDA 13.1 or later: its nvidia-cufile (1.16.0.49 on) carries "
    "sm_90; torch's cu130 wheels pin 1.15.1.6 (SASS up to sm_86), and a pip install -U "
    "nvidia-cufile alone breaks that pin. Until then the driver compiles cuFile's five "
    "GPUDirect Storage copy and wait kernels from PTX once, when they are first loaded"
)
CUFILE_LATER = (
    "nothing to install: no nvidia-cufile carries SASS for {sm} (1.15.1.6 to 1.20.0.107: "
    "sm_90 at most, PTX compute_90 from 1.16.0.49); the driver compiles cuFile's five "
    "GPUDirect Storage copy and wait kernels from PTX once, when they are first loaded"
)
BY_PACKAGE = {
    "torch": (
        "install a torch whose torch.cuda.get_arch_list() covers {sm}: CUDA 12.8 and newer "
        "wheels carry sm_120, which runs on every 12.x GPU "
        "(pip install torch --index-url https://download.pytorch.org/whl/cu130), or run "
        "NVIDIA's NGC PyTorch container"
    ),
    "vllm": (
        'build vLLM for this GPU (TORCH_CUDA_ARCH_LIST="{arch}" pip install -e . '
        "--no-build-isolation) or run NVIDIA's vLLM container for it"
    ),
    "flash-attn": (
        "build flash-attention from source for {sm} (FLASH_ATTN_CUDA_ARCHS and "
        'TORCH_CUDA_ARCH_LIST="{arch}"), or use torch\'s scaled_dot_product_attention'
    ),
}
# What the public reports say of GB10 (sm_121) alone: said on another GPU, "no build for
# sm_121" answered a GPU of 10.0 (found in a review)
ON_GB10 = {
    "vllm": BY_PACKAGE["vllm"]
    + (
        ": the published aarch64 build carries SASS up to sm_120 and PTX sm_80 only, and on "
        "GB10 its NVFP4 MoE falls back to Marlin (vllm-project/vllm#50925)"
    ),
    "flash-attn": (
        "flash-attention publishes no build for sm_121 (Dao-AILab/flash-attention#1969): build "
        'it from source with FLASH_ATTN_CUDA_ARCHS and TORCH_CUDA_ARCH_LIST="{arch}", or use '
        "torch's scaled_dot_product_attention"
    ),
}
GB10_CAPABILITY = (12, 1)


def advice(package: str, capability: tuple[int, int]) -> str:
    """The line for ``package`` on a GPU of ``capability``."""
    fill = {
        "package": package or "the package",
        "sm": sm_name(capability),
        "arch": arch_list_entry(capability),
        "num": f"{capability[0]}{capability[1]}",
    }
    if package in ON_GB10 and capability == GB10_CAPABILITY:
        return ON_GB10[package].format(**fill)
    if package in BY_PACKAGE:
        return BY_PACKAGE[package].format(**fill)
    if package == "nvidia-cufile" and capability >= (9, 0):
        return (CUFILE_HOPPER if capability[0] == 9 else CUFILE_LATER).format(**fill)
    if package.startswith("nvidia-"):
        return NVIDIA_WHEEL.format(**fill)
    return GENERAL.format(**fill)
