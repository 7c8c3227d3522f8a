"""Packaging for thunderlite. Install: ``pip install torch==2.13.0 -e '.[test]'``
(pin torch in the same pip call so pip never pulls a CUDA wheel)."""
from setuptools import find_packages, setup

setup(
    name="thunderlite",
    version="0.1.0",
    description="A trace-based JIT compiler for PyTorch programs",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["thunderlite", "thunderlite.*"]),
    package_data={"thunderlite.report": ["assets/*.css", "assets/*.js"]},
    python_requires=">=3.10",
    # numpy: without it, `import torch` itself warns "Failed to initialize NumPy" on every fresh install
    install_requires=["torch>=2.4", "looseversion", "numpy"],
    extras_require={
        # accelerate: HF Trainer needs it (thunderlite/tests/test_hf_integration.py)
        "test": ["pytest", "pytest-xdist", "expecttest", "transformers", "accelerate", "nbclient", "nbformat",
                 "ipykernel", "playwright", "triton>=3.0", "numpy", "ruff==0.17.6"],
        # executors/triton/runtime.py imports triton; Triton's CPU interpreter (and the runtime) numpy
        "triton": ["triton>=3.0", "numpy"],
        # executors/nvfuser/executor.py imports nvfuser_direct, shipped by NVIDIA's per-CUDA wheels
        # (nvfuser-cu126, nvfuser-cu128, nvfuser-cu130...); the unsuffixed "nvfuser" is a 2023 build without it
        "nvfuser": ["nvfuser-cu128"],
    },
    entry_points={
        "console_scripts": ["thunderlite-demo=thunderlite.demo:main"],
        # torch.compile(model, backend="thunderlite")
        "torch_dynamo_backends": ["thunderlite = thunderlite.dynamo:thunderlite_backend"],
    },
)
