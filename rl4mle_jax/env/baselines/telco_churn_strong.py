# Gradient-boosted trees with native categorical support.
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
cols = [c for c in test.columns if c != "id"]


def prep(df):
    df = df[cols].copy()
    for c in cols:
        if not pd.api.types.is_numeric_dtype(df[c]):
            df[c] = df[c].astype("category")
    return df


X, Xt = prep(train), prep(test)
Xt = Xt.astype({c: X[c].dtype for c in cols})
model = HistGradientBoostingClassifier(learning_rate=0.03, max_iter=250, max_depth=3,
                                       min_samples_leaf=50, l2_regularization=1.0,
                                       categorical_features="from_dtype", random_state=0)
model.fit(X, train["churn"])
pred = model.predict_proba(Xt)[:, 1]
pd.DataFrame({"id": test["id"], "churn": pred}).to_csv("submission/submission.csv", index=False)
