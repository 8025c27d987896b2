# One-hot categoricals + logistic regression.
import pandas as pd
from sklearn.compose import make_column_transformer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
cols = [c for c in test.columns if c != "id"]
cat = [c for c in cols if not pd.api.types.is_numeric_dtype(test[c])]
num = [c for c in cols if c not in cat]
prep = make_column_transformer(
    (make_pipeline(SimpleImputer(), StandardScaler()), num),
    (OneHotEncoder(handle_unknown="ignore"), cat))
model = make_pipeline(prep, LogisticRegression(max_iter=1000))
model.fit(train[cols], train["churn"])
pred = model.predict_proba(test[cols])[:, 1]
pd.DataFrame({"id": test["id"], "churn": pred}).to_csv("submission/submission.csv", index=False)
