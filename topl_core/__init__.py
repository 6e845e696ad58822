"""TOPL Workbench core: data, models, training, analysis. Never imports streamlit."""
