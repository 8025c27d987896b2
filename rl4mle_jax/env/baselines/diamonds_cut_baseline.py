# Predict the cut grade with a random forest classifier on the numeric columns.
import pandas as pd
from sklearn.ensemble import RandomForestClassifier

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
num = ["carat", "depth", "table", "price", "x", "y", "z"]
model = RandomForestClassifier(n_estimators=100, min_samples_leaf=2, random_state=0, n_jobs=1)
model.fit(train[num], train["cut"])
pd.DataFrame({"id": test["id"], "cut": model.predict(test[num])}).to_csv(
    "submission/submission.csv", index=False)
