"""The model wire: contract messages <-> chat formats, tool images, token data."""
