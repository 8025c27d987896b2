# Word 1-2 grams + character 2-5 grams, tuned logistic regression.
import pandas as pd
from scipy.sparse import hstack
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
words = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
chars = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), min_df=5, sublinear_tf=True,
                        max_features=60000)
X = hstack([words.fit_transform(train["review"]), chars.fit_transform(train["review"])]).tocsr()
Xt = hstack([words.transform(test["review"]), chars.transform(test["review"])]).tocsr()
model = LogisticRegression(C=4.0, max_iter=2000)
model.fit(X, train["is_great"])
pred = model.predict_proba(Xt)[:, 1]
pd.DataFrame({"id": test["id"], "is_great": pred}).to_csv("submission/submission.csv", index=False)
