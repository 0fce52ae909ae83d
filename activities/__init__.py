"""Temporal activities, one module per external boundary, and what workflows share with them: the
typed payloads (`schema`), the names of queues, workflow types and search attributes (`names`), and
the error types that cross Temporal (`errors`)."""
