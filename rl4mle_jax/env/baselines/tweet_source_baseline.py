# TF-IDF of the tweet text + logistic regression, probabilities per source.
import pandas as pd
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
sample = pd.read_csv("input/sample_submission.csv")
classes = [c for c in sample.columns if c != "id"]
vec = TfidfVectorizer(min_df=2)
model = LogisticRegression(max_iter=1000)
model.fit(vec.fit_transform(train["text"]), train["source"])
proba = model.predict_proba(vec.transform(test["text"]))
sub = pd.DataFrame(proba, columns=model.classes_)[classes]
sub.insert(0, "id", test["id"].values)
sub.to_csv("submission/submission.csv", index=False)
