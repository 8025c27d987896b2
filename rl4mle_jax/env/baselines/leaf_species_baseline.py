# Standardised numeric features + multinomial logistic regression.
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
sample = pd.read_csv("input/sample_submission.csv")
classes = [c for c in sample.columns if c != "id"]
features = [c for c in test.columns if c != "id" and pd.api.types.is_numeric_dtype(test[c])]
model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
model.fit(train[features], train["species"])
proba = model.predict_proba(test[features])
sub = pd.DataFrame(proba, columns=model.classes_).reindex(columns=classes, fill_value=0.0)
sub = sub.div(sub.sum(axis=1), axis=0)
sub.insert(0, "id", test["id"].values)
sub.to_csv("submission/submission.csv", index=False)
