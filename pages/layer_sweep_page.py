import streamlit as st

st.title("layer_sweep")
st.info("Coming soon.")
