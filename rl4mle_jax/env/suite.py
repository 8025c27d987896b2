"""Ids of the local task suite and where each definition lives, without importing a builder.

`tasks.py` looks tasks up here, so listing or loading by id never imports the dataset
builders (or, through them, the baselines and the grader); `get(id)` imports one on demand.
"""

from __future__ import annotations

import importlib
from typing import Any

# task id -> "module:attribute" under rl4mle_jax.env.datasets (the suite's order).
LOCATIONS: dict[str, str] = {
    "food-reviews": "text:FOOD_REVIEWS",
    "tweet-source": "text:TWEET_SOURCE",
    "leaf-species": "tabular:LEAF_SPECIES",
    "email-spam": "tabular:EMAIL_SPAM",
    "telco-churn": "tabular:TELCO_CHURN",
    "synthetic-tradeoff": "synthetic:SYNTHETIC_TRADEOFF",
    "diamonds-price": "regression:DIAMONDS_PRICE",
    "diamonds-cut": "regression:DIAMONDS_CUT",
    "hotel-rates": "regression:HOTEL_RATES",
    "meats-composition": "regression:MEATS_COMPOSITION",
    "digits": "images:DIGITS",
    "mnist": "images:MNIST",
}


def local_task_ids() -> list[str]:
    return sorted(LOCATIONS)


def get(task_id: str) -> Any:
    """The `LocalTask` definition of `task_id` (KeyError naming the known ids)."""
    if task_id not in LOCATIONS:
        raise KeyError(f"unknown local task {task_id!r}; known: {local_task_ids()}")
    module, attr = LOCATIONS[task_id].split(":")
    return getattr(importlib.import_module(f"rl4mle_jax.env.datasets.{module}"), attr)
