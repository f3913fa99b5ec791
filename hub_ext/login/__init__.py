"""Login: the OpenID Connect authenticator, its provider calls and the member's credit account at
login.
"""
