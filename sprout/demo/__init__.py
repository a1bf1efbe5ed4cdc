"""The shipped demo models (one folder each) and the script that measures them."""
