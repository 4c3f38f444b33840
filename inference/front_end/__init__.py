"""The front-end's room: HTTP, TEI's routes, checks and answers, and the link to the engine; no torch here, so a
front-end process (WORKERS > 1) holds none of the model's stack. app.py builds the app from it."""
