"""Runnable trainer-integration examples: the docs include these files (docs/guides/) and the tests run them."""
