"""Evaluation (placeholder until topl_core.analysis.evaluation lands)."""

from pages._ui import ensure_frame

ensure_frame()  # first: see pages/_ui.py

import streamlit as st

st.title("Evaluation")
st.info("Coming soon.")
