"""The `train-heat-gan` flow: the heat-evolution simulator trained on the lake's demand."""
