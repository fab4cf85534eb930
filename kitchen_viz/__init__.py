"""Engine events -> the animated two-pot kitchen, its panels and the Streamlit service layer."""
