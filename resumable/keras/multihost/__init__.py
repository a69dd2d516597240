"""A model split across the processes of a multi-host job: the part each process saves and reads."""
