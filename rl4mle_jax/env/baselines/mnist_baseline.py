# Logistic regression on scaled pixels.
import pandas as pd
from sklearn.linear_model import LogisticRegression

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
pixels = [c for c in test.columns if c.startswith("pixel")]
model = LogisticRegression(max_iter=200, C=0.1)
model.fit(train[pixels] / 255.0, train["label"])
pd.DataFrame({"id": test["id"], "label": model.predict(test[pixels] / 255.0)}).to_csv(
    "submission/submission.csv", index=False)
