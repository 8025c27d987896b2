# Text n-grams plus time-of-day, year and engagement features; logistic regression.
import numpy as np
import pandas as pd
from scipy.sparse import csr_matrix, hstack
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
sample = pd.read_csv("input/sample_submission.csv")
classes = [c for c in sample.columns if c != "id"]


def meta(df):
    t = pd.to_datetime(df["created_at"], utc=True)
    return pd.DataFrame({"hour": t.dt.hour, "year": t.dt.year, "rt": df["is_retweet"],
                         "link": df["text"].str.contains("http").astype(int),
                         "quote": df["text"].str.startswith('"').astype(int)})


words = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, token_pattern=r"\S+")
onehot = OneHotEncoder(handle_unknown="ignore")


def features(df, fit):
    text = words.fit_transform(df["text"]) if fit else words.transform(df["text"])
    m = meta(df)
    cat = onehot.fit_transform(m) if fit else onehot.transform(m)
    counts = csr_matrix(np.log1p(df[["retweet_count", "favorite_count"]].to_numpy()) / 10)
    return hstack([text, cat, counts]).tocsr()


model = LogisticRegression(C=3.0, max_iter=3000)
model.fit(features(train, True), train["source"])
proba = model.predict_proba(features(test, False))
sub = pd.DataFrame(proba, columns=model.classes_)[classes]
sub.insert(0, "id", test["id"].values)
sub.to_csv("submission/submission.csv", index=False)
