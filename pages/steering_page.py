import streamlit as st

st.title("steering")
st.info("Coming soon.")
