"""A user's library laid out as many are, one folder per backend (``userlib/backends/torch/``): its code is the
user's, whatever the folder is called."""
