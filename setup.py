"""memagent_jax: MemAgent (RL-trained long-context memory agent) in one JAX program."""

from setuptools import find_packages, setup

setup(
    name="memagent_jax",
    version="0.1.0",
    description="MemAgent: chunked reading with an overwritten text memory, trained by Multi-Conv DAPO, in JAX/Flax",
    python_requires=">=3.11",
    packages=find_packages(include=["memagent_jax", "memagent_jax.*", "configs"]),  # configs/base.py: the defaults
    package_data={"memagent_jax.runtime": ["*.cc"]},  # the CPU kernels, compiled on first use
    # Versions tested together on Python 3.11 (jax 0.11.1 breaks flax <= 0.12.8).
    install_requires=[
        "jax==0.10.2",
        "jaxlib==0.10.2",
        "flax==0.12.8",
        "optax==0.2.8",
        "orbax-checkpoint==0.12.8",
        "numpy>=2.0,<3",
        "ml_dtypes>=0.5",
        "transformers==5.23.0",
        "tokenizers==0.23.3",
        "gguf==0.19.0",
        "huggingface_hub==2.4.0",
        "ml-collections==1.1.0",
        "absl-py==2.5.1",
        "tensorflow-datasets==4.9.10",
        "grain==0.2.18",
        "array_record==0.8.6",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "tensorboardX==2.6.5",  # TensorBoard event files without TensorFlow
        "tensorboard==2.21.0",  # the viewer the README and the pipelines point to (no TensorFlow)
    ],
    extras_require={
        # torch (+ accelerate, which transformers needs to read GGUF) is only the reference
        # for parity tests; the CPU build of torch is pinned.
        "test": ["pytest>=8", "pytest-xdist==3.8.0", "torch==2.13.0", "accelerate==1.15.0",
                 # the quickstart notebook is executed by a test
                 "nbclient>=0.10", "nbformat>=5.9", "ipykernel>=6.29"],
    },
    entry_points={"console_scripts": ["memagent=memagent_jax.cli:main"]},
)
