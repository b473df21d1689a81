"""A session rendered for a person: its transcript parsed (``transcript``) and written as
HTML (``html``), Markdown (``markdown``) or for a terminal (``text``)."""
