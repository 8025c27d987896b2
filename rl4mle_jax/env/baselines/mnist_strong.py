# PCA to 50 dimensions + RBF support vector machine.
import pandas as pd
from sklearn.decomposition import PCA
from sklearn.pipeline import make_pipeline
from sklearn.svm import SVC

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
pixels = [c for c in test.columns if c.startswith("pixel")]
model = make_pipeline(PCA(n_components=50, random_state=0), SVC(C=5.0, gamma="scale"))
model.fit(train[pixels] / 255.0, train["label"])
pd.DataFrame({"id": test["id"], "label": model.predict(test[pixels] / 255.0)}).to_csv(
    "submission/submission.csv", index=False)
