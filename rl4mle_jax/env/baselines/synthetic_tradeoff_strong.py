# Gradient boosting, 300 stages of depth 4: the slow, stronger family (>= 10 s on one core).
import pandas as pd
from sklearn.ensemble import GradientBoostingClassifier

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
cols = [c for c in test.columns if c != "id"]
model = GradientBoostingClassifier(n_estimators=300, learning_rate=0.05, max_depth=4,
                                   subsample=0.8, random_state=0)
model.fit(train[cols], train["target"])
pred = model.predict_proba(test[cols])[:, 1]
pd.DataFrame({"id": test["id"], "target": pred}).to_csv("submission/submission.csv", index=False)
