"""The files probing draws for people to look at: Chrome trace event JSON for Perfetto, flame
graphs (HTML, SVG, speedscope, folded), and the one-file HTML report. Pure functions from rows
to text; the commands fetch the rows (engine) and write the files (cli/render)."""
