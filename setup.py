"""memagent_jax: MemAgent (RL-trained long-context memory agent) in one JAX program."""

from setuptools import find_packages, setup

setup(
    name="memagent_jax",
    version="0.1.0",
    description="MemAgent: chunked reading with an overwritten text memory, trained by Multi-Conv DAPO, in JAX/Flax",
    python_requires=">=3.12",  # jax >= 0.11 needs Python 3.12
    packages=find_packages(include=["memagent_jax", "memagent_jax.*", "configs"]),  # configs/base.py: the defaults
    # The supported range: from the lent GPU image's jax 0.11.2 to the current 0.12.x (flax <= 0.12.8 fails
    # on jax >= 0.11.1). `make setup` installs the one tested set in constraints.txt.
    install_requires=[
        "jax>=0.11.2,<0.13",
        "jaxlib>=0.11.2,<0.13",
        "flax>=0.12.9,<0.13",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "numpy>=2.0,<3",
        "ml_dtypes>=0.5",
        "transformers>=5.17",
        "tokenizers>=0.22",
        "gguf>=0.17",
        "huggingface_hub>=1.0",
        "ml-collections>=1.0",
        "absl-py>=2.1",
        "tensorflow-datasets>=4.9.9",
        "grain>=0.2.12",
        "array_record>=0.8",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "tensorboard>=2.18",  # event files (its own writer) and the viewer the README points to; no TensorFlow
    ],
    extras_require={
        # torch (+ accelerate, which transformers needs to read GGUF) is only the reference for
        # parity tests, run on the CPU. PyPI's Linux torch is its CUDA build (with ~3 GB of nvidia
        # wheels it cannot import without); the CPU-only build is on pytorch.org's index, not PyPI.
        "test": ["pytest>=8", "pytest-xdist>=3.6", "torch>=2.11", "accelerate>=1.10",
                 # the quickstart notebook is executed by a test
                 "nbclient>=0.10", "nbformat>=5.9", "ipykernel>=6.29"],
    },
    entry_points={"console_scripts": ["memagent=memagent_jax.cli:main"]},
)
