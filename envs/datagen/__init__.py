"""Dataset generation, the pure half: reading a corpus, chunking, question generation without a
model, the prompts and reply parsing of the model path, filters, traces and the dataset format.

Nothing here does I/O beyond parsing bytes it is given, and nothing imports temporalio: the
activities (`gymflow.activities.dataset`) read and write storage and call models; the search env
(`gymflow.envs.builtin.search`) reads the datasets written with `gymflow.envs.datagen.format`.
"""
