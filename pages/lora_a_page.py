import streamlit as st

st.title("lora_a")
st.info("Coming soon.")
