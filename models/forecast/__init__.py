"""Demand forecasting: the multi-scale attention model, baselines, and their online combination.

Total series: `PreheatForecaster` (selection.py) combines `AttentionForecaster` and the
baselines with online weights (combination.py: AdaHedge and BOA, mixed) learned from past
errors only. Per key:
`PanelForecaster` (panel.py) does the same over the top keys plus "other" (what the registry
gates and the warm-up planner reads), and `PreheatHotset` (hotset_combination.py) ranks the
keys of the next window by combining the hot-set scorers. No weight ever reads an origin's
own actuals or later ones.
"""
