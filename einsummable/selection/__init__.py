"""The last stage before the surface: the plan a user gets is the one with the least simulated
time among the MIP's optimum and the expert plans (`choose.py`)."""
