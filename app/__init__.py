"""The app layer: the `bertology` command line (`cli`), experiment files (`experiments`), figures and the Streamlit app."""
