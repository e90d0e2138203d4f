"""What each process role runs beyond Django: the one-process server and its embedded worker."""
