# Bag of words + logistic regression on the review text.
import pandas as pd
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
vec = TfidfVectorizer(min_df=2)
X = vec.fit_transform(train["review"])
model = LogisticRegression(max_iter=1000)
model.fit(X, train["is_great"])
pred = model.predict_proba(vec.transform(test["review"]))[:, 1]
pd.DataFrame({"id": test["id"], "is_great": pred}).to_csv("submission/submission.csv", index=False)
