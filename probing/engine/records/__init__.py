"""Records: the files a job's agent leaves (FILE.probing, FILE.fatal), found, read, checked,
queried and exported on this side; and asking a live agent to write one."""
