# Logistic regression on the numeric columns.
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
features = [c for c in test.columns if c != "id" and pd.api.types.is_numeric_dtype(test[c])]
model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
model.fit(train[features], train["spam"])
pred = model.predict_proba(test[features])[:, 1]
pd.DataFrame({"id": test["id"], "spam": pred}).to_csv("submission/submission.csv", index=False)
