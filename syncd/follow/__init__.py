"""Following other machines: ``follower`` (poll a machine's next segment, import its
changed sessions as a restore would), ``quiet`` (is a local file being written?)."""
