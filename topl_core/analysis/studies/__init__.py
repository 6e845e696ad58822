"""Studies of many trainings or scorings: layer sweeps, label sensitivity, detection transfer, the model's own
summaries as labelled training data."""
