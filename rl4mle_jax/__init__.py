"""rl4mle_jax: PPO for machine-learning-engineering agents in JAX/Flax."""
