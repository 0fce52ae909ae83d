"""Runnable trainer-integration examples; the README shows these files verbatim and the tests run them."""
