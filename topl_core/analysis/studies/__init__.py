"""Studies of many trainings or scorings: layer sweeps, label sensitivity, detection transfer, the model's own
summaries as labelled training data; and the registry of every data source (`data_sources.SOURCES`), here because a
source a model writes is built by a study."""
