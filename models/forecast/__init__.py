"""Demand forecasting: the multi-scale attention model, baselines, and the `preheat` choosers.

Total series: `PreheatForecaster` (selection.py) picks among `AttentionForecaster` and the
baselines on a validation slice of the train part. Per key: `PanelForecaster` (panel.py) does
the same over the top keys plus "other", and `PreheatHotset` (hotset_models.py) ranks the keys
of the next window. Every choice is made on data before the evaluation window.
"""
