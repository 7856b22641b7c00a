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
NVIDIA_WHEEL = (
    "pip install -U {package}, or its wheel of a newer CUDA (nvidia-*-cu13 for -cu12): a "
    "newer CUDA's wheel carries newer architectures (sm_120 from CUDA 12.8; nvcc 13.0 builds "
    "sm_121 and sm_121a); keep it matched to the torch that loads it (pip show torch lists "
    "its nvidia-* requirements)"
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
        "--no-build-isolation) or run NVIDIA's vLLM container for it: the published aarch64 "
        "build carries SASS up to sm_120 and PTX sm_80 only, and on GB10 its NVFP4 MoE falls "
        "back to Marlin (vllm-project/vllm#50925)"
    ),
    "flash-attn": (
        "flash-attention publishes no build for sm_121 (Dao-AILab/flash-attention#1969): build "
        'it from source with FLASH_ATTN_CUDA_ARCHS and TORCH_CUDA_ARCH_LIST="{arch}", or use '
        "torch's scaled_dot_product_attention"
    ),
}


def advice(package: str, capability: tuple[int, int]) -> str:
    """The line for ``package`` on a GPU of ``capability``."""
    fill = {
        "package": package or "the package",
        "sm": sm_name(capability),
        "arch": arch_list_entry(capability),
        "num": f"{capability[0]}{capability[1]}",
    }
    if package in BY_PACKAGE:
        return BY_PACKAGE[package].format(**fill)
    if package.startswith("nvidia-"):
        return NVIDIA_WHEEL.format(**fill)
    return GENERAL.format(**fill)
