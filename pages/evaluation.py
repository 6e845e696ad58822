import streamlit as st

st.title("evaluation")
st.info("Coming soon.")
