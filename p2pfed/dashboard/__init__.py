"""p2pfed dashboard: the live mesh (or a run folder) as a web page."""
