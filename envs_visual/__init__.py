"""Visual grid environments (gymnasium API). Imports neither torch nor vagen."""
