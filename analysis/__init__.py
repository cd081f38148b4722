"""Paper-style tables and figures from results/<experiment>/<run>/ files."""
