"""The parts of a session: small objects behind the pykvcompact.session.Session facade."""
